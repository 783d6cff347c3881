"""Model FLOPs utilization.

    achieved FLOP/s per device = tokens/s per device * FLOPs per token
    MFU                        = achieved FLOP/s per device / peak FLOP/s of that device

FLOPs per token are the *model's* FLOPs for forward + backward (about 6 * params plus the attention term;
titan-models computes it per model). Recomputation by activation checkpointing is not counted — that is
what makes it *model* FLOPs utilization rather than hardware FLOPs utilization. The peak comes from
``peak_flops`` (datasheet on GPUs, measured matmul throughput on CPU).
"""

from __future__ import annotations


def tflops(tokens_per_second_per_device: float, flops_per_token: float) -> float:
    """Achieved model TFLOP/s per device."""
    return tokens_per_second_per_device * flops_per_token / 1e12


def mfu(tokens_per_second_per_device: float, flops_per_token: float, peak: float | None) -> float | None:
    """MFU as a fraction (0.42 means 42 %), or None when the peak is unknown."""
    if peak is None:
        return None
    if peak <= 0:
        raise ValueError(f"peak={peak!r} FLOP/s must be positive (or None when unknown)")
    if tokens_per_second_per_device < 0 or flops_per_token < 0:
        raise ValueError(
            f"tokens_per_second_per_device={tokens_per_second_per_device!r} and "
            f"flops_per_token={flops_per_token!r} must be >= 0"
        )
    return tokens_per_second_per_device * flops_per_token / peak
