"""Stop (or skip the step) when the loss or the gradient norm is NaN or infinite.

Call ``check_finite`` after the gradient norm is known and before the optimizer step. With the "stop"
policy it raises before the optimizer steps and before any checkpoint of this step is saved, so the last
checkpoint on disk is the last good one. With "skip" the caller zeroes the gradients and moves on without
stepping the optimizer.
"""

from __future__ import annotations

import logging
import math
from typing import Literal

import torch

logger = logging.getLogger("titan")

NanPolicy = Literal["stop", "skip"]
POLICIES = ("stop", "skip")


class NonFiniteError(FloatingPointError):
    """Raised by ``check_finite`` under the "stop" policy; the message names the step and the values."""


def check_finite(
    step: int, loss: float | torch.Tensor, grad_norm: float | torch.Tensor | None, policy: NanPolicy = "stop"
) -> bool:
    """True if ``loss`` and ``grad_norm`` are finite. Otherwise raise ``NonFiniteError`` ("stop") or log a
    warning and return False ("skip"). ``grad_norm=None`` checks the loss only. Tensors are read with
    ``.item()`` (one device sync)."""
    if policy not in POLICIES:
        raise ValueError(f"debug.nan_policy={policy!r} is not one of {', '.join(map(repr, POLICIES))}")
    values = {"loss": _number(loss), "grad_norm": _number(grad_norm)}
    bad = {name: value for name, value in values.items() if value is not None and not math.isfinite(value)}
    if not bad:
        return True
    found = ", ".join(f"{name}={value}" for name, value in bad.items())
    if policy == "skip":
        logger.warning("step %d: %s is not finite; skipping the optimizer step (debug.nan_policy='skip')", step, found)
        return False
    raise NonFiniteError(
        f"step {step}: {found} is not finite; stopping before the optimizer step, no checkpoint is saved for "
        f"step {step} or later (debug.nan_policy='stop'; debug.nan_policy='skip' skips such steps instead)"
    )


def _number(value: float | torch.Tensor | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().item())
    return float(value)
