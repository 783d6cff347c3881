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


def reported_mfu(
    tokens_per_second_per_device: float, flops_per_token: float, peak: float | None
) -> tuple[float | None, str | None]:
    """MFU for a report, and why it shows "n/a" (None when it does not): never above 100%. A value above
    means the peak does not bound the step (e.g. a CPU peak probed in a dtype the step partly ran faster
    than), so it is withheld, not printed as a utilization."""
    value = mfu(tokens_per_second_per_device, flops_per_token, peak)
    if peak is None:
        return None, "the device's peak FLOP/s is unknown"
    if value > 1.0:
        return None, (
            f"{100 * value:.0f}% against a peak of {peak / 1e9:.1f} GFLOP/s: the peak does not bound this step"
        )
    return value, None
