"""Token-by-token Hyena with exact online long convolutions (design/flash_inference.md).

State per layer: the last short_filter_len - 1 projections (for the short convolution); for all layers
together, one OnlineConv over every layer's filter channels. Per token, each layer does only O(1)-in-L
work (projections, short conv, gates, h[0] x_t + the pending sum, MLP); the long convolutions' history
work runs once per step for all layers (`push`), because at step t every layer's inputs up to t exist.
On CUDA the whole step runs as a captured graph per tile size (hyena_step.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from titan_models.generate.hyena_step import STEP_KINDS, CudaGraphSteps, StaticStep
from titan_models.generate.online_conv import make_online_conv
from titan_models.generate.tile_split import default_split_min
from titan_models.hyena.model import HyenaLM

logger = logging.getLogger("titan")


def split_min_for(model: HyenaLM, max_len: int, batch_size: int = 1) -> int:
    """The default split_min of a flash decoder (tile_split.default_split_min): ~2 flops per parameter outside
    the embedding per token against the FFT work of every layer's filter channels."""
    args = model.args
    channels = args.n_layers * args.n_filters * args.dim
    params = sum(p.numel() for name, p in model.named_parameters() if not name.startswith("tok_embeddings"))
    return default_split_min(channels, 2.0 * params, max_len, batch_size)


class HyenaDecoder:
    """Generation state for `batch_size` sequences of up to `max_len` tokens of a whole (unsharded) HyenaLM.

    prefill(tokens [B, P], valid=None) -> logits [B, P, V], then step(tokens [B]) -> logits [B, V] per new
    token; prompts of different lengths are left-padded, with `valid` marking the padding.
    strategy: "lazy", "eager" or "flash" (see online_conv.py); all give the same outputs up to rounding.
    direct_max: the largest flash tile computed as a direct product (None: measured on this device and dtype,
    tile_crossover.py). clock: what `mixing_seconds` counts. step_kind: "sliced", "static" or "cuda_graph"
    (hyena_step.py; None: cuda_graph on CUDA, sliced elsewhere). split_min: flash's smallest tile split over the
    steps around it so the next token does not wait for all of it (tile_split.py; 0: none; None: the largest tile
    alone, if its counted FFT work reaches the model's per-token work: split_min_for).
    """

    def __init__(
        self,
        model: HyenaLM,
        max_len: int,
        strategy: str = "flash",
        batch_size: int = 1,
        direct_max: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
        step_kind: str | None = None,
        split_min: int | None = None,
    ):
        if model.tok_embeddings is None or model.output is None:
            raise ValueError("HyenaDecoder needs the whole model; this one is a pipeline stage")
        self.model = model
        self.max_len = max_len
        self.layers = list(model.layers.values())
        args = model.args
        self.order, self.kernel = args.order, args.short_filter_len
        self.filter_channels = args.n_filters * args.dim  # per layer, channel-major [c * (N - 1) + i]
        with torch.no_grad():
            h = torch.cat([layer.mixer.filter(max_len) for layer in self.layers])  # [layers * (N-1) * dim, L]
            skip = torch.cat([layer.mixer.filter.skip for layer in self.layers])
        self.h0_plus_skip = (h[:, 0] + skip.to(h.dtype)).view(len(self.layers), args.dim, args.n_filters)
        default = split_min_for(model, max_len, batch_size) if split_min is None else split_min
        self.split_min = default if strategy == "flash" else 0  # only flash has tiles
        self.conv = make_online_conv(strategy, h, batch_size, direct_max, clock, self.split_min)
        dtype = model.output.weight.dtype
        device = model.output.weight.device
        self.short_cache = [
            torch.zeros(batch_size, (self.order + 1) * args.dim, self.kernel - 1, dtype=dtype, device=device)
            for _ in self.layers
        ]
        self.t = 0
        device_type = self.short_cache[0].device.type
        self.step_kind = step_kind or ("cuda_graph" if device_type == "cuda" else "sliced")
        if self.step_kind not in STEP_KINDS:
            raise ValueError(f"step_kind={self.step_kind!r} is not a step kind; use one of {', '.join(STEP_KINDS)}")
        if self.step_kind == "cuda_graph" and device_type != "cuda":
            raise ValueError(f"step_kind='cuda_graph' needs a CUDA model; this one is on {device_type}")
        self.static_step = StaticStep(self)
        self.position = torch.zeros((), dtype=torch.long, device=self.short_cache[0].device)
        self.graphs = None
        if self.step_kind == "cuda_graph":
            try:
                self.graphs = CudaGraphSteps(self, self.conv.push_kinds())
            except RuntimeError as error:
                if step_kind is not None:
                    raise
                # The default on CUDA, not yet proven on every GPU and torch: the exact eager step serves instead.
                logger.warning(f"generation: CUDA graph capture failed ({error}); stepping eagerly ('sliced')")
                self.step_kind = "sliced"
                self.reset_state()

    def reset_state(self) -> None:
        """Zero what generation writes (after CUDA graph capture's warm-up runs, before any prefill)."""
        self.conv.reset()
        for cache in self.short_cache:
            cache.zero_()

    @property
    def mixing_seconds(self) -> float:
        """Time spent in the long convolutions (prefill FFTs, pending sums, pushes) so far."""
        return self.conv.seconds

    def state_bytes(self) -> int:
        """Bytes kept between steps: the long convolutions' state plus the short convolutions' caches."""
        caches = sum(c.numel() * c.element_size() for c in self.short_cache)
        return self.conv.state_bytes() + caches + self.h0_plus_skip.numel() * self.h0_plus_skip.element_size()

    def memory(self) -> dict[str, int]:
        """Bytes as the Flash Inference paper counts them: `history` (every layer's long-convolution inputs
        and accumulated outputs, O(L x D) per layer: `history_per_layer`), `filters` (the time-domain filters),
        `spectra` (flash's cached tile kernels), `scratch` (kept step buffers), `small` (short-conv caches,
        h[0] + D), `transient` (the largest temporary of one step: flash's biggest tile) and `state`
        (everything kept: state_bytes())."""
        counts = self.conv.memory()
        small = sum(c.numel() * c.element_size() for c in self.short_cache)
        small += self.h0_plus_skip.numel() * self.h0_plus_skip.element_size()
        return {
            **counts,
            "history_per_layer": counts["history"] // len(self.layers),
            "small": small,
            "state": self.state_bytes(),
        }

    def _channels(self, layer: int, i: int) -> slice:
        """The OnlineConv channels of filter i of `layer` (channel-major within the layer)."""
        base = layer * self.filter_channels
        return slice(base + i, base + self.filter_channels, self.order - 1)

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Run the prompt tokens [B, P] (P >= 1) through the model with FFT convolutions, recording what
        generation needs; returns logits [B, P, V].

        valid [B, P] (bool, optional): False marks left padding, so prompts of different lengths share a
        batch. Padded positions feed zeros to both convolutions (the residual stream entering each block is
        zeroed there, and so is every long convolution's input), so a row computes what its prompt alone
        would: the convolutions depend on lags only. Their logits are meaningless."""
        if self.t != 0:
            raise RuntimeError("prefill must come first, once")
        prompt = tokens.shape[1]
        if not 1 <= prompt < self.max_len:
            raise ValueError(f"prompt length {prompt} must be >= 1 and < max_len={self.max_len}")
        keep = None if valid is None else valid[:, None, :].to(self.model.output.weight.dtype)  # [B, 1, P]
        x = self.model.tok_embeddings(tokens)
        history = self.kernel - 1
        for index, layer in enumerate(self.layers):
            if keep is not None:
                x = x * keep.transpose(1, 2)  # in_proj has no bias and RMSNorm(0) = 0: zeros reach the short conv
            # The short conv's cache: the last kernel - 1 projections (none for a 1-tap conv).
            recent = layer.mixer.in_proj(layer.mixer_norm(x[:, max(prompt - history, 0) :])).transpose(1, 2)
            cache = self.short_cache[index]
            cache[..., history - recent.shape[-1] :] = recent  # zeros before a short prompt

            def long_conv(i: int, v: torch.Tensor, index: int = index) -> torch.Tensor:
                return self.conv.prefill(v if keep is None else v * keep, self._channels(index, i))

            x = layer(x, long_conv=long_conv)
        self.t = prompt
        return self.model.output(self.model.norm(x))

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per sequence [B] at position t; returns logits [B, V] for position t + 1."""
        t = self.t
        if t >= self.max_len:
            raise RuntimeError(f"HyenaDecoder holds {self.max_len} positions; all are used")
        if self.graphs is not None:
            logits = self.graphs(tokens, t, self.conv.tile_at(t))
        elif self.step_kind == "static":
            self.position.fill_(t)
            logits = self.static_step(tokens, self.position, self.conv.tile_at(t))
        else:
            logits, inputs = self.run_layers(tokens, self.conv.pending(t))  # pending: known before the step
            self.conv.push(t, inputs)
        self.t = t + 1
        return logits

    def run_layers(self, tokens: torch.Tensor, pending: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per sequence [B] through every layer, given every layer's pending sums [B, C]; returns
        (logits [B, V], the long convolutions' inputs [B, C] to record). Updates the short-conv caches in
        place (a captured graph replays on the same buffers)."""
        x = self.model.tok_embeddings(tokens)
        inputs = torch.empty_like(pending)
        n_filters = self.order - 1
        for index, layer in enumerate(self.layers):
            op = layer.mixer
            u = op.in_proj(layer.mixer_norm(x))  # [B, (N+1) * dim]
            window = torch.cat([self.short_cache[index], u.unsqueeze(-1)], dim=-1)
            self.short_cache[index].copy_(window[..., 1:])
            u = (window * op.short_filter.weight).sum(-1) + op.short_filter.bias
            *gates, v = op.split(u)
            block = slice(index * self.filter_channels, (index + 1) * self.filter_channels)
            layer_pending = pending[:, block].view(-1, self.filter_channels // n_filters, n_filters)
            layer_inputs = inputs[:, block].view(layer_pending.shape)
            for i, gate in enumerate(reversed(gates[1:])):
                v = v * gate
                layer_inputs[..., i] = v
                v = (layer_pending[..., i] + self.h0_plus_skip[index, :, i] * v).to(v.dtype)
            x = x + op.out_proj(v * gates[0])
            x = x + layer.feed_forward(layer.ffn_norm(x))
        return self.model.output(self.model.norm(x)), inputs
