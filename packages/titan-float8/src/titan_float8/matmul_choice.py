"""Real float8 matmuls, or their emulation: decided once per run from the device the matmuls run on.

torch._scaled_mm has a CPU path, but it is a slow reference (measured from ~2x to hundreds of times slower than
the emulated matmul, by CPU); emulation keeps the same float8 rounding of inputs, weights and gradients and
multiplies in high precision. So float8.emulate = "auto" emulates wherever the device has no float8 matmul units.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

logger = logging.getLogger("titan.float8")

# FP8 tensor cores: Ada (sm89) and Hopper (sm90) on.
FLOAT8_CUDA_CAPABILITY = (8, 9)
EMULATE_CHOICES = (True, False, "auto")


@dataclass(frozen=True)
class MatmulChoice:
    """What float8.emulate resolved to on a device of `device_type`: `emulate`, and `why` when emulating."""

    device_type: str
    emulate: bool
    why: str | None = None


def choose_float8_matmuls(
    emulate: bool | str, device_type: str, capability: tuple[int, int] | None = None
) -> MatmulChoice:
    """float8.emulate on a device: true and false as given; "auto" real float8 on CUDA of `capability` >= 8.9
    (None: unknown, as in a dry run modelling a GPU, taken as a float8 GPU), emulated elsewhere."""
    if emulate is True:
        return MatmulChoice(device_type, True, "float8.emulate = true")
    if emulate is False:
        return MatmulChoice(device_type, False)
    if device_type == "cuda" and (capability is None or tuple(capability) >= FLOAT8_CUDA_CAPABILITY):
        return MatmulChoice(device_type, False)
    if device_type == "cuda":
        why = f"this GPU (CUDA capability {capability[0]}.{capability[1]}) has no float8 matmul units"
        return MatmulChoice(device_type, True, why)
    return MatmulChoice(device_type, True, "this device has no float8 matmul units")


def device_float8_choice(emulate: bool | str, device: torch.device | str | None = None) -> MatmulChoice:
    """choose_float8_matmuls for `device` (None: CUDA where available, else the CPU), its capability read from
    the device itself when it is a real CUDA device."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    capability = None
    if device.type == "cuda" and torch.cuda.is_available():
        capability = torch.cuda.get_device_capability(device)
    return choose_float8_matmuls(emulate, device.type, capability)


def warn_real_float8_on_cpu(size: int = 128) -> float:
    """Warn that float8.emulate = false runs torch's CPU reference of _scaled_mm, with how much slower it ran
    than the emulated matmul here (one size x size x size product each); returns that ratio."""
    a = torch.randn(size, size).to(torch.float8_e4m3fn)
    b = torch.randn(size, size).to(torch.float8_e4m3fn).t()  # _scaled_mm takes its second operand column-major
    one = torch.tensor(1.0)
    x, y = a.to(torch.bfloat16), b.to(torch.bfloat16)

    def seconds(matmul) -> float:
        matmul()  # first call: dispatch and allocation
        start = time.perf_counter()
        matmul()
        return time.perf_counter() - start

    real = seconds(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    emulated = seconds(lambda: torch.mm(x, y))
    ratio = real / max(emulated, 1e-9)
    logger.warning(
        f"float8.emulate = false on a CPU: torch._scaled_mm runs its CPU reference here, {ratio:.0f}x the time of "
        f"the emulated matmul (measured now, {size}x{size}x{size}). Use --float8.emulate auto (the default) or true "
        "for the same float8 numerics at high-precision matmul speed"
    )
    return ratio
