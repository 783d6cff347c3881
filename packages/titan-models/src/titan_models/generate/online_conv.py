"""Exact online causal convolution y_t = sum_{s <= t} h[t - s] x_s over many channels at once, for
generation: x_t is known only after y_{t-1} went through the network. Three strategies, same numbers:

- lazy:  at each step, a dot product of the history with the reversed filter (O(t) per step);
- eager: once x_t exists, push h[1:] x_t into an accumulator of future outputs (O(L - t) per step);
- flash: push in tiles of growing size (tiling.py; O(log^2 L) amortized per step), FFT for large tiles.

All keep the inputs [C, B, L] and read, at step t, `pending(t)` = sum_{s < t} h[t - s] x_s; the model adds
the h[0] x_t term itself (it is on the token's critical path). One instance holds every layer's channels,
so each step's work for all layers is one batched operation. A prompt is prefilled with FFTs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from titan_models.generate.tiling import TileKernels, tile_size

STRATEGIES = ("lazy", "eager", "flash")


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
        return sum(t.numel() * t.element_size() for t in self._state())

    def _state(self) -> list[torch.Tensor]:
        return [self.h, self.x]

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


class LazyConv(OnlineConv):
    """A dot product over the history at each step."""

    def __init__(self, h: torch.Tensor, batch_size: int, clock: Callable[[], float] = time.perf_counter):
        super().__init__(h, batch_size, clock)
        self.h_reversed = h.flip(-1).unsqueeze(1)  # [C, 1, L]; column L - 1 - k holds h[k]
        # Products land here, then are summed: 2-3x faster on CPU than bmm's C tiny matrix-vector products.
        self.products = torch.empty_like(self.x)

    def _state(self) -> list[torch.Tensor]:
        return [*super()._state(), self.h_reversed, self.products]

    def _pending(self, t: int) -> torch.Tensor:
        # h[t - s] for s = 0..t-1 is h_reversed[L - 1 - t + s].
        lags = self.h_reversed[..., self.length - 1 - t : self.length - 1]
        products = torch.mul(self.x[..., :t], lags, out=self.products[..., :t])
        return products.sum(-1).transpose(0, 1)

    def _push(self, t: int) -> None:
        pass


class _Accumulating(OnlineConv):
    """Keeps acc[C, B, L]: the contributions of earlier inputs to each output, filled ahead of time."""

    def __init__(self, h: torch.Tensor, batch_size: int, clock: Callable[[], float] = time.perf_counter):
        super().__init__(h, batch_size, clock)
        self.acc = torch.zeros_like(self.x)

    def _state(self) -> list[torch.Tensor]:
        return [*super()._state(), self.acc]

    def _prefill(self, x: torch.Tensor, channels: slice) -> torch.Tensor:
        # One FFT gives the prompt's outputs and its contributions to every later position.
        y = _fft_conv_full(x, self.h[channels], self.length)
        prompt = x.shape[-1]
        self.acc[channels, :, prompt:] += y[..., prompt:]
        return y[..., :prompt]

    def _pending(self, t: int) -> torch.Tensor:
        return self.acc[:, :, t].transpose(0, 1)


class EagerConv(_Accumulating):
    """Each new input pushes its contribution into every later output."""

    def _push(self, t: int) -> None:
        rest = self.length - 1 - t
        if rest > 0:
            self.acc[:, :, t + 1 :].addcmul_(self.h[:, None, 1 : rest + 1], self.x[:, :, t : t + 1])


class FlashConv(_Accumulating):
    """Tiles of growing size (tiling.py): small ones as direct Toeplitz products, large ones by FFT."""

    def __init__(
        self, h: torch.Tensor, batch_size: int, direct_max: int = 8, clock: Callable[[], float] = time.perf_counter
    ):
        super().__init__(h, batch_size, clock)
        self.kernels = TileKernels(h, direct_max)

    def _state(self) -> list[torch.Tensor]:
        return [*super()._state(), *self.kernels.toeplitz.values(), *self.kernels.spectra.values()]

    def _push(self, t: int) -> None:
        i = t + 1
        if i >= self.length:
            return
        size = tile_size(i - self.start)
        end = min(i + size, self.length)
        self.acc[:, :, i:end] += self.kernels(self.x[:, :, i - size : i])[..., : end - i]


def make_online_conv(
    strategy: str,
    h: torch.Tensor,
    batch_size: int,
    direct_max: int = 8,
    clock: Callable[[], float] = time.perf_counter,
) -> OnlineConv:
    """An online convolution of filters h [C, L] for `batch_size` sequences of up to L positions."""
    if strategy == "lazy":
        return LazyConv(h, batch_size, clock)
    if strategy == "eager":
        return EagerConv(h, batch_size, clock)
    if strategy == "flash":
        return FlashConv(h, batch_size, direct_max, clock)
    raise ValueError(f"strategy={strategy!r} is not a long-convolution strategy; use one of {', '.join(STRATEGIES)}")
