"""Hyena's per-token step in a form a CUDA graph can hold: every layer's projections, short convolution, gates, h[0] x_t
+ pending sum and MLP, then the long convolutions' push, with the position a 0-d device tensor and every shape fixed
by the tile size alone. So there are ~log2 L distinct steps (one per tile size, plus "no push" at the last position,
plus two per split tile size: conv.push_kinds()), each captured once and replayed: one launch per token instead of
~50 per layer (the launch storm that bound every strategy on a GPU at small widths). Nothing in the step reads a
tensor on the host; `torch.compile(..., fullgraph=True)` proves it on a CPU (tests/generate/test_hyena_step.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import torch
from torch import nn

from titan_models.generate.online_conv import OnlineConv
from titan_models.generate.tiling import tile_sizes

__all__ = ["STEP_KINDS", "CudaGraphSteps", "StaticStep", "tile_sizes"]


class HyenaDecoder(Protocol):
    """What the steps use of the decoder they run: hyena_decode's HyenaDecoder, which builds them (a Protocol,
    so the two modules do not import each other)."""

    model: nn.Module
    conv: OnlineConv
    max_len: int

    def run_layers(self, tokens: torch.Tensor, pending: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def reset_state(self) -> None: ...


STEP_KINDS = ("sliced", "static", "cuda_graph")
"""sliced: the position a host int, history slices as long as it (least work; CPU default). static: the
graph-ready step run eagerly (the CPU proof of the CUDA path). cuda_graph: static, captured per tile size
(CUDA default)."""


class StaticStep:
    """decoder's step with a device-side position: (tokens [B], position 0-d int64, tile) -> logits [B, V].

    `tile` is conv.tile_at(t), a host-side int (or a split tile's Push, tile_split.py) that the host knows
    without asking the device."""

    def __init__(self, decoder: HyenaDecoder):
        self.decoder = decoder

    def __call__(self, tokens: torch.Tensor, position: torch.Tensor, tile) -> torch.Tensor:
        conv = self.decoder.conv
        logits, inputs = self.decoder.run_layers(tokens, conv.pending_at(position))
        conv.record_at(position, inputs)
        conv.push_at(position, tile)
        return logits

    def for_tile(self, tile: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The step of one tile size, as a function of the tensors alone (what one graph captures)."""

        def step(tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
            return self(tokens, position, tile)

        return step


class CudaGraphSteps:
    """StaticStep captured as one CUDA graph per tile size, on static input/output buffers, sharing one memory
    pool (they never run at the same time). Captured at decoder build, while the state is still all zeros:
    the warm-up runs that capture needs (cuFFT plans, the allocator) write into the state, which is zeroed
    again afterwards."""

    def __init__(self, decoder: HyenaDecoder, tiles: Iterable[int]):
        device = decoder.model.output.weight.device
        rows = decoder.conv.x.shape[1]
        vocab = decoder.model.output.weight.shape[0]
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.position = torch.zeros((), dtype=torch.long, device=device)
        self.logits = torch.zeros(rows, vocab, dtype=decoder.model.output.weight.dtype, device=device)
        step = StaticStep(decoder)
        tiles = list(tiles)
        # Warm up at the last position, where every tile reads only positions that exist (an index below 0
        # would be a device-side assert); capture records kernels without running them, so there any value does.
        self.position.fill_(decoder.max_len - 1)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), torch.no_grad():
            for tile in tiles:
                for _ in range(2):
                    self.logits.copy_(step(self.tokens, self.position, tile))
        torch.cuda.current_stream(device).wait_stream(side)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        pool = None
        for tile in tiles:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool), torch.no_grad():
                self.logits.copy_(step(self.tokens, self.position, tile))
            pool = graph.pool()
            self.graphs[tile] = graph
        decoder.reset_state()

    def __call__(self, tokens: torch.Tensor, t: int, tile: int) -> torch.Tensor:
        self.tokens.copy_(tokens)
        self.position.fill_(t)  # a host scalar into a kernel argument: no synchronisation
        self.graphs[tile].replay()
        return self.logits.clone()  # the next replay overwrites the static buffer
