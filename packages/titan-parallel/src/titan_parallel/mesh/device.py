"""The one place that decides which device and collective backend a run uses.

Everything else asks `device_type()` instead of naming "cuda", so the same code runs on CUDA/NCCL,
other accelerators, and CPU/gloo (where all of Titan's tests run).
"""

import os

import torch

_BACKENDS = {"cuda": "nccl", "cpu": "gloo", "xpu": "xccl", "hpu": "hccl"}


def device_type() -> str:
    """The accelerator torch sees ("cuda", "xpu", ...), or "cpu" when there is none.

    `TITAN_DEVICE=cpu` forces the CPU even where an accelerator exists (useful to reproduce CI).
    """
    forced = os.environ.get("TITAN_DEVICE")
    if forced:
        return forced
    if torch.accelerator.is_available():
        return torch.accelerator.current_accelerator().type
    return "cpu"


def device_module(kind: str | None = None):
    """`torch.cuda`, `torch.xpu`, ... for the device kind; `torch.cpu` on CPU."""
    return getattr(torch, kind or device_type())


def distributed_backend(kind: str | None = None) -> str:
    """The collective backend for the device kind: nccl on CUDA, gloo on CPU."""
    kind = kind or device_type()
    if kind not in _BACKENDS:
        raise ValueError(f"no known torch.distributed backend for device type {kind!r}; known: {sorted(_BACKENDS)}")
    return _BACKENDS[kind]
