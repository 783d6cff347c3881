"""Exact online causal convolution y_t = sum_{s <= t} h[t - s] x_s over many channels at once, for
generation: x_t is known only after y_{t-1} went through the network. Three strategies, same numbers:

- lazy:  at each step, a dot product of the history with the reversed filter (O(t) per step);
- eager: once x_t exists, push h[1:] x_t into an accumulator of future outputs (O(L - t) per step);
- flash: push in tiles of growing size (tiling.py; O(log^2 L) amortized per step), FFT for large tiles.

All keep the inputs [C, B, L] and read, at step t, `pending(t)` = sum_{s < t} h[t - s] x_s; the model adds
the h[0] x_t term itself (it is on the token's critical path). One instance holds every layer's channels,
so each step's work for all layers is one batched operation. A prompt is prefilled with FFTs.

Each strategy has two forms of its step: `pending(t)` / `push(t, x_t)` with the position a Python int (slices
as long as the history: least work, a new shape every step), and `pending_at(position)` / `record_at(...)` /
`push_at(position, tile)` with the position a 0-d device tensor and shapes fixed per tile size, so a step can
be captured once per tile size as a CUDA graph (hyena_step.py). The fixed-shape lazy and eager forms work over
all L positions every step (the not-yet-written ones are zeros), twice the arithmetic of the sliced forms.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from titan_models.generate.tile_crossover import measure_direct_max
from titan_models.generate.tile_split import (
    Push,
    SplitKernels,
    blocks,
    check_split_min,
    push_of,
    split_sizes,
    step_parts,
    transient_bytes,
)
from titan_models.generate.tiling import TileKernels, tile_sizes

STRATEGIES = ("lazy", "eager", "flash")


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _fft_conv_full(x: torch.Tensor, h: torch.Tensor, length: int) -> torch.Tensor:
    """Causal convolution of x [C, B, P] with h [C, >= length], outputs at positions 0..length-1."""
    n = x.shape[-1] + length
    spectrum = torch.fft.rfft(x, n=n) * torch.fft.rfft(h[:, :length], n=n)[:, None, :]
    return torch.fft.irfft(spectrum, n=n)[..., :length]


class OnlineConv:
    """Base: inputs history and the prompt prefill. `seconds` accumulates the time spent here (the position
    mixing that the strategies differ in) by `clock`, for benchmarks (time.process_time counts only this
    process's CPU time, steadier than wall time on a shared machine when torch runs one thread)."""

    def __init__(self, h: torch.Tensor, batch_size: int, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.h = h
        self.channels, self.length = h.shape
        self.x = torch.zeros(self.channels, batch_size, self.length, dtype=h.dtype, device=h.device)
        self.start = 0
        self.seconds = 0.0

    def prefill(self, x: torch.Tensor, channels: slice) -> torch.Tensor:
        """Record a prompt's inputs x [B, c, P] for `channels` and return their outputs [B, c, P] (one FFT).

        Call once per channel group before any step; every group must give the same P.
        """
        begin = self.clock()
        x = x.transpose(0, 1).to(self.h.dtype)
        prompt = x.shape[-1]
        self.x[channels, :, :prompt] = x
        self.start = prompt
        y = self._prefill(x, channels)
        self.seconds += self.clock() - begin
        return y.transpose(0, 1)

    def _prefill(self, x: torch.Tensor, channels: slice) -> torch.Tensor:
        return _fft_conv_full(x, self.h[channels], x.shape[-1])

    def state_bytes(self) -> int:
        """Bytes of the tensors this convolution keeps between steps (temporaries of a step not included)."""
        return sum(_nbytes(t) for t in self._state())

    def _state(self) -> list[torch.Tensor]:
        return [tensor for group in self._state_groups().values() for tensor in group]

    def _state_groups(self) -> dict[str, list[torch.Tensor]]:
        """The kept tensors by what the paper counts: history (inputs and accumulated outputs: O(L) per channel
        and row), filters (the time-domain filter and copies of it), spectra (flash's tile kernels), scratch."""
        return {"history": [self.x], "filters": [self.h], "spectra": [], "scratch": []}

    def memory(self) -> dict[str, int]:
        """Bytes per group of _state_groups, plus `transient`: the largest temporary one step allocates."""
        counts = {name: sum(_nbytes(t) for t in group) for name, group in self._state_groups().items()}
        return {**counts, "transient": self._transient_bytes()}

    def _transient_bytes(self) -> int:
        return 0  # lazy and eager work in place or into kept buffers; their sums are [B, C]

    def pending(self, t: int) -> torch.Tensor:
        """[B, C]: sum over s < t of h[t - s] x_s."""
        begin = self.clock()
        out = self._pending(t)
        self.seconds += self.clock() - begin
        return out

    def push(self, t: int, x_t: torch.Tensor) -> None:
        """Record input x_t [B, C] of position t (all channels), after its outputs were read."""
        begin = self.clock()
        self.x[:, :, t] = x_t.transpose(0, 1)
        self._push(t)
        self.seconds += self.clock() - begin

    def _pending(self, t: int) -> torch.Tensor:
        raise NotImplementedError

    def _push(self, t: int) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Zero the history (the filters and their kernels stay)."""
        for tensor in self._state_groups()["history"]:
            tensor.zero_()
        self.start = 0

    def tile_at(self, t: int) -> int:
        """The push size after input t (a host-side int: which captured step to run); 0 when none is needed."""
        return 1 if t + 1 < self.length else 0

    def push_kinds(self) -> list:
        """Every value tile_at can return (one CUDA graph each)."""
        return tile_sizes(self.length)

    def pending_at(self, position: torch.Tensor) -> torch.Tensor:
        """pending(t) for t held in a 0-d int64 tensor on the device, without reading it on the host."""
        raise NotImplementedError

    def record_at(self, position: torch.Tensor, x_t: torch.Tensor) -> None:
        """Store input x_t [B, C] at the position held in `position` (no host read)."""
        self.x.index_copy_(2, position.view(1), x_t.transpose(0, 1).unsqueeze(-1).to(self.x.dtype))

    def push_at(self, position: torch.Tensor, tile: int) -> None:
        """push()'s work after record_at, for the tile size that tile_at(t) gave (0: nothing)."""


class LazyConv(OnlineConv):
    """A dot product over the history at each step."""

    def __init__(self, h: torch.Tensor, batch_size: int, clock: Callable[[], float] = time.perf_counter):
        super().__init__(h, batch_size, clock)
        self.h_reversed = h.flip(-1).unsqueeze(1)  # [C, 1, L]; column L - 1 - k holds h[k]
        # Products land here, then are summed: 2-3x faster on CPU than bmm's C tiny matrix-vector products.
        self.products = torch.empty_like(self.x)

    def _state_groups(self) -> dict[str, list[torch.Tensor]]:
        groups = super()._state_groups()
        return {**groups, "filters": [self.h, self.h_reversed], "scratch": [self.products]}

    def _pending(self, t: int) -> torch.Tensor:
        # h[t - s] for s = 0..t-1 is h_reversed[L - 1 - t + s].
        lags = self.h_reversed[..., self.length - 1 - t : self.length - 1]
        products = torch.mul(self.x[..., :t], lags, out=self.products[..., :t])
        return products.sum(-1).transpose(0, 1)

    def _push(self, t: int) -> None:
        pass

    def pending_at(self, position: torch.Tensor) -> torch.Tensor:
        # Over all L inputs: those at s >= t are still zeros, so lag max(t - s, 0) is as good as any there.
        lags = (position - torch.arange(self.length, device=position.device)).clamp_(min=0)
        products = torch.mul(self.x, self.h.index_select(1, lags)[:, None, :], out=self.products)
        return products.sum(-1).transpose(0, 1)


class _Accumulating(OnlineConv):
    """Keeps acc[C, B, L]: the contributions of earlier inputs to each output, filled ahead of time."""

    def __init__(self, h: torch.Tensor, batch_size: int, clock: Callable[[], float] = time.perf_counter):
        super().__init__(h, batch_size, clock)
        self.acc = torch.zeros_like(self.x)

    def _state_groups(self) -> dict[str, list[torch.Tensor]]:
        groups = super()._state_groups()
        return {**groups, "history": [self.x, self.acc]}

    def _prefill(self, x: torch.Tensor, channels: slice) -> torch.Tensor:
        # One FFT gives the prompt's outputs and its contributions to every later position.
        y = _fft_conv_full(x, self.h[channels], self.length)
        prompt = x.shape[-1]
        self.acc[channels, :, prompt:] += y[..., prompt:]
        return y[..., :prompt]

    def _pending(self, t: int) -> torch.Tensor:
        return self.acc[:, :, t].transpose(0, 1)

    def pending_at(self, position: torch.Tensor) -> torch.Tensor:
        return self.acc.index_select(2, position.view(1)).squeeze(-1).transpose(0, 1)


class EagerConv(_Accumulating):
    """Each new input pushes its contribution into every later output."""

    def _push(self, t: int) -> None:
        rest = self.length - 1 - t
        if rest > 0:
            self.acc[:, :, t + 1 :].addcmul_(self.h[:, None, 1 : rest + 1], self.x[:, :, t : t + 1])

    def push_at(self, position: torch.Tensor, tile: int) -> None:
        if tile == 0:
            return
        # Output k gets h[k - t] x_t for k > t: the filter shifted by t, zero at and before t.
        lags = torch.arange(self.length, device=position.device) - position
        shifted = self.h.index_select(1, lags.clamp(min=0)) * (lags > 0)
        x_t = self.x.index_select(2, position.view(1))
        self.acc.addcmul_(shifted[:, None, :], x_t)


class FlashConv(_Accumulating):
    """Tiles of growing size (tiling.py): small ones as direct Toeplitz products, large ones by FFT; tiles of size
    >= split_min split over the steps around them (tile_split.py; 0: none)."""

    def __init__(
        self,
        h: torch.Tensor,
        batch_size: int,
        direct_max: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
        split_min: int = 0,
    ):
        super().__init__(h, batch_size, clock)
        if direct_max is None:  # measured on this device (tile_crossover.py)
            direct_max = measure_direct_max(batch_size, h.dtype, h.device)
        self.kernels = TileKernels(h, direct_max)
        self.split_min = check_split_min(split_min)
        self.split = SplitKernels(h, split_min, direct_max) if split_min else None

    def _state_groups(self) -> dict[str, list[torch.Tensor]]:
        kernels = [*self.kernels.toeplitz.values(), *self.kernels.spectra.values()]
        kernels += self.split.tensors() if self.split else []
        return {**super()._state_groups(), "spectra": kernels}

    def _transient_bytes(self) -> int:
        """The largest step's temporaries (tile_split.transient_bytes). Its largest tile: the largest power of two
        <= the generated positions - 1."""
        generated = self.length - 1 - self.start
        largest = 1 << (generated.bit_length() - 1) if generated >= 1 else 0
        rows = self.channels * self.x.shape[1]
        return transient_bytes(largest, rows, self.kernels.direct_max, self.split_min, self.h.element_size())

    def _work(self, i: int) -> int | Push:
        return push_of(i - self.start, self.split_min, self.length - i)

    def _push(self, t: int) -> None:
        i = t + 1
        if i >= self.length:
            return
        push = self._work(i)

        def read(offset: int, count: int) -> torch.Tensor:
            return self.x[:, :, i + offset : i + offset + count]

        for offset, contribution in step_parts(self.kernels, self.split, push, read):
            end = min(i + offset + contribution.shape[-1], self.length)
            self.acc[:, :, i + offset : end] += contribution[..., : end - i - offset]

    @property
    def largest_block(self) -> int:
        """The largest block of any step from the prompt on (what the split bounds), from the schedule."""
        steps = range(self.start + 1, self.length)
        return max((block.size for i in steps for block in blocks(self._work(i))), default=0)

    def tile_at(self, t: int) -> int | Push:
        return self._work(t + 1) if t + 1 < self.length else 0

    def push_kinds(self) -> list[int | Push]:
        halves = split_sizes(self.length, self.split_min)
        # A split tile of size U runs as a plain U / 2 (its B -> C); a size >= split_min runs plain only so.
        plain = [size for size in tile_sizes(self.length) if size < (self.split_min or self.length) or size in halves]
        return [*plain, *(Push(1, h, 0) for h in halves), *(Push(1, 0, h) for h in halves)]

    def push_at(self, position: torch.Tensor, tile: int | Push) -> None:
        if tile == 0:
            return
        base = position + 1

        def read(offset: int, count: int) -> torch.Tensor:
            return self.x.index_select(2, base + offset + torch.arange(count, device=position.device))

        for offset, contribution in step_parts(self.kernels, self.split, tile, read):
            # Outputs past the end are dropped: their contributions become zeros added to the last position.
            outputs = base + offset + torch.arange(contribution.shape[-1], device=position.device)
            inside = outputs < self.length
            self.acc.index_add_(2, outputs.clamp(max=self.length - 1), contribution * inside)


def make_online_conv(
    strategy: str,
    h: torch.Tensor,
    batch_size: int,
    direct_max: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
    split_min: int = 0,
) -> OnlineConv:
    """An online convolution of filters h [C, L] for `batch_size` sequences of up to L positions. direct_max:
    flash's largest direct-product tile (None: measured on h's device, tile_crossover.py); split_min: flash's
    smallest tile split over the steps around it (tile_split.py; 0: none)."""
    if strategy == "lazy":
        return LazyConv(h, batch_size, clock)
    if strategy == "eager":
        return EagerConv(h, batch_size, clock)
    if strategy == "flash":
        return FlashConv(h, batch_size, direct_max, clock, split_min)
    raise ValueError(f"strategy={strategy!r} is not a long-convolution strategy; use one of {', '.join(STRATEGIES)}")
