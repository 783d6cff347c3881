"""Swap a model's nn.Linear layers for torchao's Float8Linear, deciding layer by layer and saying why.

A Float8Linear keeps its weight in high precision and casts input, weight and gradient to float8 (with a
dynamic scale computed from the tensor's absolute max) just before each of the three matmuls of forward
and backward. Parameter names and shapes do not change, so checkpoints, weight init and parallel plans
keyed by name all keep working. Convert on the meta device, before tensor parallelism and FSDP.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from titan_float8.matmul_choice import EMULATE_CHOICES, device_float8_choice, warn_real_float8_on_cpu
from titan_float8.requirements import require_torchao

logger = logging.getLogger("titan.float8")

RECIPES = ("tensorwise", "rowwise")

# torch._scaled_mm needs both matrix dims of each operand to be multiples of 16.
_DIM_MULTIPLE = 16


@dataclass
class Float8Options:
    """[float8]: float8 training through torchao. The docstrings are the config reference."""

    enable: bool = False
    """Swap the model's nn.Linear layers for torchao Float8Linear: float8 matmuls in forward and backward,
    weights and optimizer state stay in high precision. Pays off on GPUs with FP8 tensor cores (H100-class);
    on CPU it reproduces float8 numerics only, slowly."""
    recipe: Literal["tensorwise", "rowwise"] = "tensorwise"
    """Scaling granularity: "tensorwise" (one dynamic scale per tensor; fastest; the only one with float8
    all-gather for FSDP and float8 collectives for TP) or "rowwise" (one scale per row, scales rounded down to
    powers of two; more accurate, slower kernels)."""
    filter_fqns: list[str] = field(default_factory=lambda: ["output"])
    """Linear layers to keep in high precision: a layer is skipped when any entry is a substring of its
    name (e.g. "output" skips the final projection, whose float8 error hurts the loss most). Layers whose
    in/out features are not multiples of 16 are skipped automatically."""
    enable_fsdp_float8_all_gather: bool = False
    """FSDP all-gathers float8 weights (half the bytes of bf16) instead of high-precision ones; the scale is
    computed from the whole unsharded weight, so numerics match a single process. tensorwise only."""
    precompute_float8_dynamic_scale_for_fsdp: bool = False
    """After each optimizer step, compute every float8 weight's scale in one all-reduce instead of one
    small all-reduce per weight inside the next forward. Needs enable_fsdp_float8_all_gather."""
    emulate: bool | Literal["auto"] = "auto"
    """Run the float8 matmuls as dequantize + high-precision matmul instead of torch._scaled_mm: the same
    float8 rounding of inputs, weights and gradients, on hardware without FP8 tensor cores. "auto": real
    float8 matmuls where the device has them (CUDA capability 8.9+), emulated elsewhere (on CPU
    torch._scaled_mm is a reference implementation, up to hundreds of times slower); true or false force it."""

    def validate(self, device: torch.device | None = None) -> None:
        """Raise ValueError naming the first field that cannot work (with `device`, also check it can)."""
        if self.emulate not in EMULATE_CHOICES or not isinstance(self.emulate, (bool, str)):
            raise ValueError(f"float8.emulate={self.emulate!r} must be true, false or 'auto'")
        if self.recipe not in RECIPES:
            raise ValueError(f"float8.recipe={self.recipe!r} is not supported; use {' or '.join(map(repr, RECIPES))}")
        if not isinstance(self.filter_fqns, (list, tuple)) or not all(isinstance(f, str) for f in self.filter_fqns):
            raise ValueError(f"float8.filter_fqns={self.filter_fqns!r} must be a list of module-name substrings")
        if self.enable_fsdp_float8_all_gather and self.recipe != "tensorwise":
            raise ValueError(
                f"float8.enable_fsdp_float8_all_gather=True needs float8.recipe='tensorwise' (got {self.recipe!r}): "
                "torchao all-gathers float8 weights with one scale per tensor only"
            )
        if self.precompute_float8_dynamic_scale_for_fsdp and not self.enable_fsdp_float8_all_gather:
            raise ValueError(
                "float8.precompute_float8_dynamic_scale_for_fsdp=True needs "
                "float8.enable_fsdp_float8_all_gather=True: the scales it precomputes are those of the "
                "float8 all-gather"
            )
        if self.enable and self.emulate is False and device is not None and device.type == "cuda":
            capability = torch.cuda.get_device_capability(device)
            if capability < (8, 9):
                raise ValueError(
                    f"float8.enable=True needs FP8 tensor cores (CUDA capability >= 8.9: H100, L40S, RTX 4090); "
                    f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}. "
                    "Set float8.emulate=true to check numerics, or float8.enable=false"
                )


@dataclass
class Float8Report:
    """What `convert_to_float8` did: converted layer names, and skipped ones with the reason."""

    recipe: str
    converted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    emulated: str | None = None
    """Why the matmuls are emulated (float8.emulate resolved on the run's device); None: real float8."""

    def summary(self) -> str:
        skipped = "; ".join(f"{fqn} ({reason})" for fqn, reason in self.skipped.items()) or "none"
        how = f"{self.recipe}, emulated: {self.emulated}" if self.emulated else self.recipe
        return f"float8 ({how}): converted {len(self.converted)} Linear layers; skipped {skipped}"


def skip_reason(fqn: str, module: nn.Module, filter_fqns: list[str]) -> str | None:
    """Why the Linear `module` named `fqn` stays in high precision, or None to convert it."""
    match = next((f for f in filter_fqns if f in fqn), None)
    if match is not None:
        return f"matches float8.filter_fqns entry {match!r}"
    if type(module) is not nn.Linear:
        return f"{type(module).__name__} is not a plain nn.Linear"
    bad = {
        name: size
        for name, size in (("in_features", module.in_features), ("out_features", module.out_features))
        if size % _DIM_MULTIPLE
    }
    if bad:
        dims = " and ".join(f"{name}={size}" for name, size in bad.items())
        return f"{dims} not a multiple of {_DIM_MULTIPLE} (torch._scaled_mm needs it)"
    return None


def convert_to_float8(
    model: nn.Module, options: Float8Options, device: torch.device | str | None = None
) -> Float8Report:
    """Swap `model`'s eligible nn.Linear layers for Float8Linear in place; log and return what happened.

    Call on the model built on the meta device, before tensor parallelism, compile and FSDP (the float8
    all-gather weight wrapper must exist when FSDP shards the parameters). A no-op when options.enable
    is False. `device`: where the matmuls will run, for float8.emulate = "auto" (None: CUDA where available,
    else the CPU; a dry run passes the device type it models).
    """
    options.validate()
    report = Float8Report(recipe=options.recipe)
    if not options.enable:
        return report
    if isinstance(model, nn.Linear):
        raise ValueError("convert_to_float8 converts a model's Linear submodules in place; got a bare nn.Linear")
    float8 = require_torchao()
    from torchao.float8.float8_linear import Float8Linear

    for fqn, module in model.named_modules():
        if isinstance(module, Float8Linear):
            report.skipped[fqn] = "already Float8Linear"
        elif isinstance(module, nn.Linear):
            reason = skip_reason(fqn, module, list(options.filter_fqns))
            if reason is None:
                report.converted.append(fqn)
            else:
                report.skipped[fqn] = reason
        elif any(p.ndim == 3 for p in module.parameters(recurse=False)):
            # A mixture of experts' stacked weights, computed by a grouped matmul, not by Linear layers.
            report.skipped[fqn] = "3-D expert weights: no float8 grouped matmul here, kept in high precision"
    to_convert = set(report.converted)
    choice = device_float8_choice(options.emulate, device)
    report.emulated = choice.why
    if not choice.emulate and choice.device_type == "cpu" and to_convert:
        warn_real_float8_on_cpu()

    config = float8.Float8LinearConfig.from_recipe_name(options.recipe)
    config = dataclasses.replace(
        config, enable_fsdp_float8_all_gather=options.enable_fsdp_float8_all_gather, emulate=choice.emulate
    )
    float8.convert_to_float8_training(model, config=config, module_filter_fn=lambda _, fqn: fqn in to_convert)

    logger.info(report.summary())
    for fqn in report.converted:
        logger.debug(f"float8: converted {fqn}")
    return report
