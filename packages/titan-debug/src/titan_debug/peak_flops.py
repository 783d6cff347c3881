"""Peak FLOP/s of a device, the denominator of MFU.

CUDA (and ROCm, which PyTorch also calls "cuda"): looked up by GPU name in a table of *dense* (no 2:4
sparsity) tensor-core numbers from the vendor datasheets. Datasheets print the sparse number first; the
dense one is half of it. An unknown GPU gives ``None`` (MFU then shows "n/a") rather than a guess.

CPU: there is no datasheet number that a PyTorch matmul can reach, so "peak" here is the *measured
attainable* matmul throughput: a short probe (< ~1 s) of square matmuls in the requested dtype, best of
several repeats. The result is cached per machine in ``$TITAN_CACHE_DIR/peak_flops.json`` (default
``~/.cache/titan``), keyed by CPU model, whether it computes bf16 natively, torch thread count, torch version
and dtype, so later runs do not pay for the probe. CPU MFU is therefore "fraction of what a plain matmul gets
on this box", and can be compared across runs on the same machine, not across machines.

A mixed-precision step on a CPU runs some matmuls in float32 (the loss, and every op autocast keeps there)
and the rest in bf16/fp16; where the CPU has no native bf16 (AVX2 only: no AVX-512 BF16, no AMX) those run
~40x slower than float32. The CPU peak for bf16/fp16 is therefore the faster of that dtype's and float32's:
a ceiling no step can pass, so MFU stays a fraction.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import time
from pathlib import Path

import torch

logger = logging.getLogger("titan")

_T = 1e12

# (model name, {column: dense FLOP/s}). A model name matches the device name case-insensitively as a whole
# token (so "A100" is not found in "RTX A1000" and "L4" not in "L40"); first hit wins, so specific variants
# (H100 NVL) come before their family (H100).
# Columns: bf16 / fp16 tensor core, tf32 tensor core (used for float32 when TF32 matmuls are enabled),
# fp32 non-tensor. A missing column means the GPU has no such unit (e.g. V100 has no bf16 tensor cores).
# Sources: NVIDIA datasheets (H100, H200, A100, A10, L4, L40, L40S, V100, HGX B200, GB200 NVL72), AMD
# Instinct MI300X / MI325X / MI250X product pages.
_GPU_PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("GB200", {"bf16": 2500 * _T, "fp16": 2500 * _T, "tf32": 1250 * _T, "fp32": 80 * _T}),  # NVL72 / 72
    ("B200", {"bf16": 2250 * _T, "fp16": 2250 * _T, "tf32": 1125 * _T, "fp32": 75 * _T}),  # HGX B200 / 8
    ("H100 NVL", {"bf16": 835.5 * _T, "fp16": 835.5 * _T, "tf32": 417.5 * _T, "fp32": 60 * _T}),
    ("H100 PCIe", {"bf16": 756 * _T, "fp16": 756 * _T, "tf32": 378 * _T, "fp32": 51 * _T}),
    ("H100", {"bf16": 989.5 * _T, "fp16": 989.5 * _T, "tf32": 494.5 * _T, "fp32": 67 * _T}),  # SXM
    ("H200 NVL", {"bf16": 835.5 * _T, "fp16": 835.5 * _T, "tf32": 417.5 * _T, "fp32": 60 * _T}),
    ("H200", {"bf16": 989.5 * _T, "fp16": 989.5 * _T, "tf32": 494.5 * _T, "fp32": 67 * _T}),  # SXM
    ("GH200", {"bf16": 989.5 * _T, "fp16": 989.5 * _T, "tf32": 494.5 * _T, "fp32": 67 * _T}),
    ("A100", {"bf16": 312 * _T, "fp16": 312 * _T, "tf32": 156 * _T, "fp32": 19.5 * _T}),
    # AWS's A10G has no NVIDIA datasheet of its own; these are the A10 numbers, so treat MFU as approximate.
    ("A10G", {"bf16": 125 * _T, "fp16": 125 * _T, "tf32": 62.5 * _T, "fp32": 31.2 * _T}),
    ("A10", {"bf16": 125 * _T, "fp16": 125 * _T, "tf32": 62.5 * _T, "fp32": 31.2 * _T}),
    ("L40S", {"bf16": 362.05 * _T, "fp16": 362.05 * _T, "tf32": 183 * _T, "fp32": 91.6 * _T}),
    ("L40", {"bf16": 181.05 * _T, "fp16": 181.05 * _T, "tf32": 90.5 * _T, "fp32": 90.5 * _T}),
    ("L4", {"bf16": 121 * _T, "fp16": 121 * _T, "tf32": 60 * _T, "fp32": 30.3 * _T}),
    ("V100S", {"fp16": 130 * _T, "fp32": 16.4 * _T}),
    ("V100-PCIE", {"fp16": 112 * _T, "fp32": 14 * _T}),
    ("V100", {"fp16": 125 * _T, "fp32": 15.7 * _T}),  # SXM2
    ("MI300X", {"bf16": 1307.4 * _T, "fp16": 1307.4 * _T, "fp32": 163.4 * _T}),
    ("MI325X", {"bf16": 1307.4 * _T, "fp16": 1307.4 * _T, "fp32": 163.4 * _T}),
    # ROCm shows each of the MI250X's two dies (GCDs) as one device: half the card's numbers.
    ("MI250X", {"bf16": 191.5 * _T, "fp16": 191.5 * _T, "fp32": 47.85 * _T}),
)

_CPU_PROBE_BUDGET_S = 0.5


def lookup_gpu_peak_flops(device_name: str, dtype: torch.dtype, *, tf32: bool = False) -> float | None:
    """Dense datasheet peak FLOP/s for a GPU name (``torch.cuda.get_device_name``), or None if unknown.

    ``tf32`` selects the TF32 tensor-core peak for float32 matmuls (when PyTorch is allowed to use them).
    """
    if dtype == torch.bfloat16:
        column = "bf16"
    elif dtype == torch.float16:
        column = "fp16"
    elif dtype == torch.float32:
        column = "tf32" if tf32 else "fp32"
    else:
        return None
    for model, peaks in _GPU_PEAK_FLOPS:
        if re.search(rf"(?<![a-z0-9]){re.escape(model)}(?![0-9])", device_name, re.IGNORECASE):
            if column == "tf32" and column not in peaks:
                column = "fp32"
            return peaks.get(column)
    return None


def peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """Peak FLOP/s of one ``device`` for matmuls in ``dtype``; None when unknown (see module docstring)."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = lookup_gpu_peak_flops(name, dtype, tf32=_tf32_enabled())
        if peak is None:
            logger.warning("peak FLOP/s unknown for GPU %r and %s; MFU will show n/a", name, dtype)
        return peak
    if device.type == "cpu":
        peak = _cached_cpu_peak_flops(dtype)
        return peak if dtype == torch.float32 else max(peak, _cached_cpu_peak_flops(torch.float32))
    logger.warning("peak FLOP/s unknown for device type %r; MFU will be reported as n/a", device.type)
    return None


def _tf32_enabled() -> bool:
    return torch.get_float32_matmul_precision() != "highest" or bool(torch.backends.cuda.matmul.allow_tf32)


def cache_dir() -> Path:
    """Titan's per-machine cache directory: ``$TITAN_CACHE_DIR`` or ``~/.cache/titan``."""
    return Path(os.environ.get("TITAN_CACHE_DIR") or Path.home() / ".cache" / "titan")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def _cpu_flags() -> set[str]:
    """The CPU's feature flags (x86 "flags", ARM "Features") from /proc/cpuinfo; empty where unreadable."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (x86 AVX-512 BF16 or AMX, ARM BF16); without it torch
    emulates bf16 matmuls at a fraction of float32's speed."""
    return bool(_cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"})


def _cpu_cache_key(dtype: torch.dtype) -> str:
    dtype_name = str(dtype).removeprefix("torch.")
    bf16 = "native" if cpu_has_native_bf16() else "emulated"
    return f"{_cpu_model()}|bf16={bf16}|threads={torch.get_num_threads()}|torch={torch.__version__}|{dtype_name}"


def _cached_cpu_peak_flops(dtype: torch.dtype) -> float:
    path = cache_dir() / "peak_flops.json"
    key = _cpu_cache_key(dtype)
    try:
        cache = json.loads(path.read_text())
        if not isinstance(cache, dict):
            cache = {}
    except (OSError, ValueError):
        cache = {}
    cached = cache.get(key)
    if isinstance(cached, (int, float)) and cached > 0:
        return float(cached)

    flops = probe_cpu_matmul_flops(dtype)
    logger.debug("measured CPU matmul peak %.1f GFLOP/s for %s; caching in %s", flops / 1e9, key, path)
    cache[key] = flops
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write-then-rename: ranks on one machine may probe at the same time; a reader never sees half a file.
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError as e:
        logger.debug("could not write peak FLOP/s cache %s: %s", path, e)
    return flops


def probe_cpu_matmul_flops(dtype: torch.dtype, budget_s: float = _CPU_PROBE_BUDGET_S) -> float:
    """Best observed FLOP/s of an ``n x n`` matmul in ``dtype`` on this CPU, within about ``budget_s``.

    ``n`` doubles from 256 until one matmul takes >= 10 ms (or n = 2048), so slow dtypes (e.g. bf16 without
    AVX512-BF16/AMX) stay within budget and fast ones still run a matmul big enough to leave the caches.
    """
    deadline = time.perf_counter() + budget_s
    best = 0.0
    n = 256
    while True:
        a = torch.randn(n, n).to(dtype)
        b = torch.randn(n, n).to(dtype)
        torch.mm(a, b)  # warm-up: kernel selection, page faults on the output
        t0 = time.perf_counter()
        torch.mm(a, b)
        dt = time.perf_counter() - t0
        best = max(best, 2 * n**3 / dt)
        if dt >= 0.01 or n >= 2048 or time.perf_counter() + 8 * dt > deadline:
            break
        n *= 2
    for _ in range(10):
        if time.perf_counter() + dt > deadline:
            break
        t0 = time.perf_counter()
        torch.mm(a, b)
        dt = time.perf_counter() - t0
        best = max(best, 2 * n**3 / dt)
    return best
