"""Large flash tiles split over the steps around them, so the token after a large tile does not wait for all of it
(the Flash Inference paper's critical-path concern). Exact: the same pairs, the same lags, other steps.

Step i (i = start + j) runs after input i - 1 exists and before output i is read. Unsplit, it runs the tile of
size U = j & -j: inputs [i - U, i) -> outputs [i, i + U) (tiling.py). With the split on, a tile with
U >= split_min (H = U / 2; inputs A = [i - U, i - H), B = [i - H, i); outputs C = [i, i + H), D = [i + H, i + U))
becomes four H x H Toeplitz blocks, each run at a step that may run it (its inputs exist, its outputs are unread):

    B -> C   at step i      lags  1 .. 2H - 1   a plain tile of size H: all the token after input i - 1 waits for
    A -> C   at step i - 1  lags H+1 .. 3H - 1  A is complete since step i - H; C is first read at step i
    A -> D   at step i + 1  lags 2H+1 .. 4H - 1 } one FFT product each, summed before one inverse FFT; D is first
    B -> D   at step i + 1  lags H+1 .. 3H - 1  } read at step i + H > i + 1

Steps i - 1 and i + 1 have j odd, so their own tile has size 1, and no step is both (j - 1 and j + 1 are not both
multiples of split_min >= 4). Invariant: every (input s, output t) pair with start <= s < t < length is still
covered by exactly one block, and every block runs at a step k with its inputs < k <= its outputs, so no output is
read before all its contributions are in (tests/generate/test_tile_split.py checks both over whole schedules).

Work (`step_work`): a split tile costs 7 FFTs of 2H = U points (B -> C 2, A -> C 2, D 3) against 2 of 2U (the
filter's spectra are cached): ~1.6x that tile's FFT work (7 U log U against 4 U log 2U), still O(U log U), so the
whole run stays O(L log^2 L); only tiles >= split_min pay it (by default the largest alone). The largest FFT of any
step is half as long, and the most any one step does is ~0.7 of the unsplit tile's (3 transforms of U points instead
of 2 of 2U). The blocks have fixed shapes per H, so a CUDA-graph step needs two more graphs per split size (the
steps before and after a split tile). Kernels: two more per split size, H + 1 complex bins (or H^2 values, direct)
each: < L per channel.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from titan_models.generate.tiling import TileKernels, tile_size, tile_sizes


class Push(NamedTuple):
    """A step's work beside its plain tile: `ahead` = H of a split tile's A -> C block (the step before it),
    `behind` = H of its A -> D and B -> D blocks (the step after); 0: none."""

    tile: int
    ahead: int = 0
    behind: int = 0


class Block(NamedTuple):
    """Inputs [i + inputs, + size) -> outputs [i + outputs, + size) at step i; lags shift * size + 1 ..."""

    inputs: int
    outputs: int
    size: int
    shift: int


def check_split_min(split_min: int) -> int:
    if split_min != 0 and (split_min < 4 or split_min & (split_min - 1)):
        raise ValueError(f"split_min={split_min} must be 0 (no split) or a power of two >= 4 (e.g. 1024)")
    return split_min


def _is_split(j: int, split_min: int) -> bool:
    return split_min > 0 and j > 0 and tile_size(j) >= split_min


def push_of(j: int, split_min: int, outputs_left: int) -> int | Push:
    """The work of the step once j inputs exist (j >= 1), `outputs_left` outputs from its position on: a plain
    tile size (an int, as without the split) or a Push. Blocks whose outputs are all past the end are left out."""
    size = tile_size(j)
    if _is_split(j, split_min):
        return size // 2  # B -> C
    ahead = tile_size(j + 1) // 2 if _is_split(j + 1, split_min) and outputs_left > 1 else 0
    behind = tile_size(j - 1) // 2 if _is_split(j - 1, split_min) else 0
    behind = behind if outputs_left > behind - 1 else 0
    return Push(size, ahead, behind) if ahead or behind else size


def blocks(push: int | Push) -> list[Block]:
    """The blocks of a step's work, relative to its position i."""
    push = Push(push) if isinstance(push, int) else push
    out = [Block(-push.tile, 0, push.tile, 0)] if push.tile else []
    if push.ahead:
        h = push.ahead
        out.append(Block(1 - 2 * h, 1, h, 1))
    if push.behind:
        h = push.behind
        out += [Block(-1 - 2 * h, h - 1, h, 2), Block(-1 - h, h - 1, h, 1)]
    return out


def step_work(push: int | Push, direct_max: int) -> float:
    """Counted work per channel and row: n log2 n per FFT of n points (2 per FFT block of size U, n = 2U: the
    inputs' forward and the product's inverse, the filter's spectrum is cached; 3 for the step after a split
    tile, whose two blocks share the inverse), U^2 per direct block."""
    push = Push(push) if isinstance(push, int) else push

    def cost(size: int, transforms: int, direct_blocks: int = 1) -> float:
        return transforms * 2 * size * math.log2(2 * size) if size > direct_max else direct_blocks * size * size

    return cost(push.tile, 2) + cost(push.ahead, 2) + cost(push.behind, 3, direct_blocks=2)


# Below this many input values per split block (channels x rows x H), a block's few torch ops cost more in fixed
# overhead than the halved FFT saves: tiny (128 channels) at L = 256-512, B = 1-2, took 1.2-1.5x longer around the
# largest tile split; the 512 x 4-layer shape (2,048 channels) at H = 256, B = 1, 0.87x (docs/hyena-generation.md).
MIN_BLOCK_VALUES = 1 << 18


def default_split_min(channels: int, token_flops: float, length: int, rows: int = 1) -> int:
    """The largest tile of a run of `length` positions (the largest power of two <= length - 2: a prompt has at
    least one token), if its FFT work (~2.5 n log2 n flops per real FFT, step_work) reaches the model's own
    per-token work (token_flops per row, ~2 x parameters) and its halves hold >= MIN_BLOCK_VALUES inputs
    (channels x rows x U / 2); else 0. Counted, not timed: the same on any device. Below that work a tile at most
    doubles its token's step; above, the tile is the step, and splitting it cuts the largest step to ~0.7.
    Splitting smaller tiles too would lower no maximum (the largest split tile's step after it stays the
    largest) and cost ~1.6x each split level's FFT work: at L = 4096, +9% of the whole run's FFT work for the
    largest tile alone, +25% from U = 512 on."""
    if length < 6:
        return 0
    largest = 1 << ((length - 2).bit_length() - 1)
    heavy = 2.5 * channels * step_work(largest, direct_max=0) >= token_flops
    return largest if heavy and channels * rows * largest // 2 >= MIN_BLOCK_VALUES else 0


def split_sizes(length: int, split_min: int) -> list[int]:
    """H of every split tile size U >= split_min (U < length)."""
    return [size // 2 for size in tile_sizes(length)[1:] if split_min and size >= split_min]


class SplitKernels:
    """The far blocks' kernels (shift 1: A -> C and B -> D; shift 2: A -> D) for each split size H."""

    def __init__(self, h: torch.Tensor, split_min: int, direct_max: int):
        halves = split_sizes(h.shape[1], split_min)
        self.direct_max = direct_max
        self.near = TileKernels(h, direct_max, shift=1, sizes=halves)
        self.far = TileKernels(h, direct_max, shift=2, sizes=halves)

    def tensors(self) -> list[torch.Tensor]:
        kernels = (self.near, self.far)
        return [t for k in kernels for t in (*k.toeplitz.values(), *k.spectra.values())]

    def behind(self, x: torch.Tensor) -> torch.Tensor:
        """x [C, B, 2H] (A then B) -> [C, B, H]: A -> D plus B -> D, one inverse FFT for both."""
        size = x.shape[-1] // 2
        if size <= self.direct_max:
            return torch.baddbmm(
                torch.bmm(x[..., :size], self.far.toeplitz[size]), x[..., size:], self.near.toeplitz[size]
            )
        spectra = torch.fft.rfft(x.unflatten(-1, (2, size)), n=2 * size)  # [C, B, 2, H + 1]
        product = spectra[..., 0, :] * self.far.spectra[size][:, None, :]
        product.addcmul_(spectra[..., 1, :], self.near.spectra[size][:, None, :])
        return torch.fft.irfft(product, n=2 * size)[..., size - 1 : 2 * size - 1]


def step_parts(
    tiles: TileKernels, split: SplitKernels | None, push: int | Push, read: Callable[[int, int], torch.Tensor]
) -> list[tuple[int, torch.Tensor]]:
    """(first output relative to i, contributions [C, B, n]) of a step's work; read(offset, count) gives the
    inputs [C, B, count] from position i + offset on."""
    push = Push(push) if isinstance(push, int) else push
    parts = [(0, tiles(read(-push.tile, push.tile)))] if push.tile else []
    if push.ahead:
        h = push.ahead
        parts.append((1, split.near(read(1 - 2 * h, h))))
    if push.behind:
        h = push.behind
        parts.append((h - 1, split.behind(read(-1 - 2 * h, 2 * h))))
    return parts


def transient_bytes(largest: int, rows: int, direct_max: int, split_min: int, itemsize: int) -> int:
    """The largest temporary of one step when the largest tile is `largest` (rows = channels x batch): an FFT
    tile's two [rows, U + 1] complex buffers (inputs' spectrum, product), a direct tile's [rows, U]; split, the
    step after it holds three [rows, H + 1] (A's and B's spectra, the product), two [rows, H] direct."""
    if largest == 0:
        return 0
    if split_min and largest >= split_min:
        half = largest // 2
        if half <= direct_max:
            return 2 * rows * half * itemsize
        return 3 * rows * (half + 1) * 2 * itemsize
    if largest <= direct_max:
        return rows * largest * itemsize
    return 2 * rows * (largest + 1) * 2 * itemsize
