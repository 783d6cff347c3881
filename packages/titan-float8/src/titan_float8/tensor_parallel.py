"""Tensor parallelism for float8 layers: the model's TP plan with torchao's float8 styles swapped in.

torchao's Float8ColwiseParallel / Float8RowwiseParallel / PrepareFloat8ModuleInput shard parameters as the
plain styles do, but cast activations to float8 *before* the TP all-gather (and gradients before the
backward reduce-scatter), so those collectives move float8 bytes. The cast's scale comes from the amax of
the whole, unsharded tensor (an all-reduce over the TP group), so numerics match one process.

Which layers get a float8 style: a ColwiseParallel / RowwiseParallel entry whose modules are all tensorwise
Float8Linear, and a PrepareModuleInput entry whose module contains Float8Linear layers only (its prepared
input is then cast once and fed to each of them: the plan must only use PrepareModuleInput where the
module's input goes to its Linear layers, as Llama's attention and feed_forward do). Everything else keeps
its plain style: layers left in high precision (the output layer with the default float8.filter_fqns),
embeddings, norms, and rowwise-recipe layers (torchao's float8 TP styles scale tensorwise; a rowwise
Float8Linear under plain styles still computes in float8, with high-precision collectives).

Plain styles also work for tensorwise Float8Linear (float8 matmuls, high-precision collectives); that is
what gloo needs: it has no float8 dtype, so `float8_tp_plan` keeps the plain plan on a CPU mesh, unless
told the collectives are a GPU's (a dry run on a CPU, which simulates them on a fake process group).
"""

from __future__ import annotations

import logging
from fnmatch import fnmatch
from typing import TYPE_CHECKING, NamedTuple

from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, PrepareModuleInput, RowwiseParallel

from titan_float8.requirements import require_torchao

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

logger = logging.getLogger("titan.float8")


class Float8TPStyles(NamedTuple):
    colwise: type[ColwiseParallel]
    rowwise: type[RowwiseParallel]
    prepare_module_input: type[PrepareModuleInput]


def float8_tp_styles() -> Float8TPStyles:
    """torchao's (Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput)."""
    require_torchao()
    from torchao.float8.float8_tensor_parallel import (
        Float8ColwiseParallel,
        Float8RowwiseParallel,
        PrepareFloat8ModuleInput,
    )

    return Float8TPStyles(Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput)


def float8_tp_plan(
    plan: dict[str, ParallelStyle],
    model: nn.Module,
    mesh: DeviceMesh | None = None,
    collectives_device_type: str | None = None,
) -> dict[str, ParallelStyle]:
    """`plan` with float8 styles for the layers of `model` that convert_to_float8 converted (tensorwise).

    `model` is the converted model the plan will be applied to; keys are parallelize_module patterns ("*"
    matches one name). When an entry's pattern matches float8 and high-precision modules alike, it is split
    into one entry per module. Where the collectives run on CPU (gloo: no float8 collectives), returns the
    plan unchanged: `collectives_device_type`, else `mesh`'s (a dry run on a CPU passes "cuda": it simulates
    the collectives a CUDA run would make).
    """
    if (collectives_device_type or (mesh.device_type if mesh is not None else None)) == "cpu":
        logger.info("float8: TP on CPU (gloo has no float8 dtype) keeps high-precision collectives")
        return dict(plan)
    styles = float8_tp_styles()
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_linear import Float8Linear

    def tensorwise_float8(module: nn.Module) -> bool:
        if not isinstance(module, Float8Linear):
            return False
        c = module.config
        casts = (c.cast_config_input, c.cast_config_weight, c.cast_config_grad_output)
        return all(cast.scaling_granularity is ScalingGranularity.TENSORWISE for cast in casts)

    def float8_style(style: ParallelStyle, module: nn.Module) -> ParallelStyle:
        if type(style) is ColwiseParallel and tensorwise_float8(module):
            return styles.colwise(**_linear_style_kwargs(style))
        if type(style) is RowwiseParallel and tensorwise_float8(module):
            return styles.rowwise(**_linear_style_kwargs(style))
        if type(style) is PrepareModuleInput:
            linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
            if linears and all(tensorwise_float8(m) for m in linears):
                return styles.prepare_module_input(
                    input_layouts=style.input_layouts,
                    desired_input_layouts=style.desired_input_layouts,
                    input_kwarg_layouts=style.input_kwarg_layouts if style.with_kwargs else None,
                    desired_input_kwarg_layouts=style.desired_input_kwarg_layouts if style.with_kwargs else None,
                    use_local_output=style.use_local_output,
                )
        return style

    swapped: dict[str, ParallelStyle] = {}
    for pattern, style in plan.items():
        if type(style) not in (ColwiseParallel, RowwiseParallel, PrepareModuleInput):
            swapped[pattern] = style
            continue
        matches = _matching_modules(model, pattern)
        chosen = {fqn: float8_style(style, module) for fqn, module in matches.items()}
        if len({type(s) for s in chosen.values()}) <= 1:
            # One style for every match (or no match: parallelize_module warns about the pattern).
            swapped[pattern] = next(iter(chosen.values()), style)
        else:
            swapped.update(chosen)
    return swapped


def _linear_style_kwargs(style: ColwiseParallel | RowwiseParallel) -> dict:
    return {
        "input_layouts": style.input_layouts[0],
        "output_layouts": style.output_layouts[0],
        "use_local_output": style.use_local_output,
    }


def _matching_modules(model: nn.Module, pattern: str) -> dict[str, nn.Module]:
    """The submodules a parallelize_module key names, by FQN (each dot-separated token is an fnmatch)."""
    found = {"": model}
    for token in pattern.split("."):
        found = {
            f"{prefix}.{name}" if prefix else name: child
            for prefix, module in found.items()
            for name, child in module.named_children()
            if fnmatch(name, token)
        }
    return found
