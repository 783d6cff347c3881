"""The tiling of an online (relaxed) convolution whose filter is known in advance (design/flash_inference.md).

Positions start .. length-1 are generated one at a time. After input i - 1 exists (i = start + j, j >= 1),
the tile of size U = j & -j (the largest power of two dividing j) adds the contribution of the last U
inputs [i - U, i) to the next U outputs [i, i + U). Every pair (input s, output t) with start <= s < t <
length is covered by exactly one tile; there are about n / 2^(q+1) tiles of size 2^q, so with FFT tiles the
total work is O(n log^2 n) instead of the O(n^2) of a dot product per token. Large tiles can be split over
the steps around them (tile_split.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch


def tile_size(j: int) -> int:
    """Size of the tile run once j inputs (relative to the start) exist: the largest power of two dividing j."""
    return j & -j


def tile_sizes(length: int) -> list[int]:
    """Every plain tile size a run of `length` positions can need: 0 (no push) and 1, 2, 4, .. < length."""
    sizes, size = [0], 1
    while size < length:
        sizes.append(size)
        size *= 2
    return sizes


def tiles(length: int, start: int = 0) -> Iterator[tuple[int, int]]:
    """(i, U) for every tile of positions [start, length): inputs [i - U, i) -> outputs [i, min(i + U, length))."""
    for i in range(start + 1, length):
        yield i, tile_size(i - start)


class TileKernels:
    """Per-size tile kernels of filters h [C, L]: a tile maps inputs x [C, B, U] to contributions [C, B, U].

    The contribution of x[a] (input i - U + a) to output i + b is h[U + b - a]: a U x U Toeplitz block of
    lags 1 .. 2U - 1. Small tiles multiply by it directly (a batched matmul); large ones multiply spectra:
    irfft(rfft(x, 2U) * rfft(h[1 : 2U], 2U))[U - 1 : 2U - 1] (the circular wrap-around lands in the first
    U - 1 outputs, which are not read). The crossover (`direct_max`) is a matter of speed only: FFT tiles win
    from U = 8 or 16 on one CPU thread for 128 to 1024 channels.

    Memory: one kernel per size U = 1, 2, 4, .. < L: U + 1 complex bins per FFT size and U^2 values per
    direct size, so sum_U (U + 1) < L + log2 L complex numbers per channel -- O(L), like the history itself.
    """

    def __init__(self, h: torch.Tensor, direct_max: int = 8, shift: int = 0, sizes: Iterable[int] | None = None):
        channels, length = h.shape
        self.direct_max = direct_max
        self.toeplitz: dict[int, torch.Tensor] = {}
        self.spectra: dict[int, torch.Tensor] = {}
        # shift s: the block's lags are s * U + 1 .. s * U + 2U - 1 (a split tile's far blocks, tile_split.py).
        for size in tile_sizes(length)[1:] if sizes is None else sizes:
            # Lags up to 2U - 1 may pass the end of h; those outputs are past the end too, so zeros do.
            lags = torch.zeros(channels, 2 * size, dtype=h.dtype, device=h.device)
            first = shift * size + 1
            available = max(min(2 * size - 1, length - first), 0)
            lags[:, :available] = h[:, first : first + available]  # lags[:, m] = h[first + m]
            if size <= direct_max:
                a = torch.arange(size, device=h.device)
                # T^T[a, b] = h[U + b - a] = lags[U - 1 + b - a], so that x [.., a] @ T^T -> [.., b].
                self.toeplitz[size] = lags[:, size - 1 + a[None, :] - a[:, None]]
            else:
                self.spectra[size] = torch.fft.rfft(lags, n=2 * size)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [C, B, U] (inputs of one tile) -> [C, B, U] (contributions to the next U outputs)."""
        size = x.shape[-1]
        if size <= self.direct_max:
            return torch.bmm(x, self.toeplitz[size])
        spectrum = torch.fft.rfft(x, n=2 * size) * self.spectra[size][:, None, :]
        return torch.fft.irfft(spectrum, n=2 * size)[..., size - 1 : 2 * size - 1]
