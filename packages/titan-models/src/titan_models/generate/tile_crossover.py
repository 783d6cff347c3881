"""The tile size up to which a flash tile is faster as a direct Toeplitz product than as an FFT, measured on the
device the decoder runs on (design/flash_inference.md: ~16 on one CPU thread; a GPU's launch and cuFFT costs
put it elsewhere). Measured once per (device, dtype, batch size) in a process and cached; a few milliseconds.
"""

from __future__ import annotations

import time

import torch

from titan_models.generate.tiling import TileKernels

# Larger direct tiles cost U^2 values per channel to keep (the FFT ones U + 1 bins): 32 bounds that at 1,365
# values per channel over all direct sizes, about what a 1k-length filter itself holds.
CANDIDATES = (1, 2, 4, 8, 16, 32)
_REPEATS = 5
# Both kernels' cost grows linearly in the channels past a few thousand; measuring on more only costs memory.
_CHANNELS = 2048
_cache: dict[tuple[str, int | None, torch.dtype, int], int] = {}


def _seconds(call, device: torch.device) -> float:
    """Fastest of a few runs (after one warm-up run): steadier than the mean on a shared machine."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    call()
    best = float("inf")
    for _ in range(_REPEATS):
        sync()
        start = time.perf_counter()
        call()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def measure_direct_max(batch_size: int, dtype: torch.dtype, device: torch.device) -> int:
    """Largest tile size U (0 or a power of two in CANDIDATES) whose direct product beats the FFT for tiles
    [channels, batch_size, U] on `device` in `dtype`; the first size where the FFT wins ends the search."""
    device = torch.device(device)
    key = (device.type, device.index, dtype, batch_size)
    if key in _cache:
        return _cache[key]
    generator = torch.Generator().manual_seed(0)
    largest = CANDIDATES[-1]
    h = torch.randn(_CHANNELS, 4 * largest, generator=generator, dtype=dtype).to(device)
    direct, fft = TileKernels(h, direct_max=largest), TileKernels(h, direct_max=0)
    best = 0
    for size in CANDIDATES:
        x = torch.randn(_CHANNELS, batch_size, size, generator=generator, dtype=dtype).to(device)
        if _seconds(lambda x=x: direct(x), device) > _seconds(lambda x=x: fft(x), device):
            break
        best = size
    _cache[key] = best
    return best
