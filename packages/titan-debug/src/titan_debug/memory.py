"""Peak memory of one device, for the per-step log line.

Keys are the same on every device so the JSONL schema does not depend on where the run happened:

    peak_gib           accelerator: peak bytes held by tensors (``allocated_bytes.all.peak``);
                       CPU: the process's peak resident set size (Linux: ``VmHWM``; elsewhere ``ru_maxrss``),
                       which also counts Python, libraries and the allocator's slack — there is no caching
                       allocator to ask.
    peak_active_gib    accelerator: peak active bytes (allocated + not yet reusable); CPU: same as peak_gib.
    peak_reserved_gib  accelerator: peak bytes the caching allocator took from the driver; CPU: peak_gib.
    num_alloc_retries  accelerator: times the allocator had to free its cache and retry (a sign of memory
                       pressure and fragmentation, and slow); CPU: 0.
    num_ooms           accelerator: out-of-memory errors raised; CPU: 0.

Peaks on an accelerator cover the window since the last reset (``reset_peak=True`` or
``reset_peak_memory_stats``); on CPU the peak is over the whole process and is not reset. ``VmHWM`` is this
process's own: ``ru_maxrss`` also keeps the peak of the process that forked it (it survives ``execve``), so a
worker started by a large parent would report the parent's peak.
"""

from __future__ import annotations

import resource
import sys

import torch

_GIB = 1024**3


def memory_stats(device: torch.device, reset_peak: bool = False) -> dict[str, float | int]:
    """Peak memory of ``device`` in GiB plus allocator retry / OOM counts (see module docstring)."""
    device = torch.device(device)
    if device.type == "cpu":
        return _cpu_memory_stats()
    stats = _accelerator_memory_stats(device)
    if reset_peak:
        reset_peak_memory_stats(device)
    return {
        "peak_gib": stats.get("allocated_bytes.all.peak", 0) / _GIB,
        "peak_active_gib": stats.get("active_bytes.all.peak", 0) / _GIB,
        "peak_reserved_gib": stats.get("reserved_bytes.all.peak", 0) / _GIB,
        "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
        "num_ooms": int(stats.get("num_ooms", 0)),
    }


def reset_peak_memory_stats(device: torch.device) -> None:
    """Start a new peak window on an accelerator; a no-op on CPU (the process peak is not reset)."""
    device = torch.device(device)
    if device.type == "cpu":
        return
    if _is_current_accelerator(device):
        torch.accelerator.reset_peak_memory_stats(device)
    elif device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _accelerator_memory_stats(device: torch.device) -> dict:
    if _is_current_accelerator(device):
        return dict(torch.accelerator.memory_stats(device))
    if device.type == "cuda":
        return dict(torch.cuda.memory_stats(device))
    raise ValueError(f"memory_stats: device {device} is neither the CPU nor this machine's accelerator")


def _own_peak_rss_kib() -> int | None:
    """This process's peak RSS in KiB from /proc/self/status (Linux), else None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _is_current_accelerator(device: torch.device) -> bool:
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == device.type


def _cpu_memory_stats() -> dict[str, float | int]:
    peak = _own_peak_rss_kib()
    if peak is not None:
        peak = peak / (1024**2)
    else:
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # Linux reports KiB, macOS bytes.
        peak = maxrss / _GIB if sys.platform == "darwin" else maxrss / (1024**2)
    return {
        "peak_gib": peak,
        "peak_active_gib": peak,
        "peak_reserved_gib": peak,
        "num_alloc_retries": 0,
        "num_ooms": 0,
    }
