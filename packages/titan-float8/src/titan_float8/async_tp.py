"""Float8Linear under titan-parallel's async tensor parallel ("titan"): its three matmuls in float8, offered
to the chunked collectives through titan-parallel's duck-typed protocol (the packages share no import).

    offer_async_tp_matmuls(model)    # after convert_to_float8, before apply_tp(..., async_tp="titan")

Plain float8 TP with high-precision collectives (what a CPU mesh gets, tensor_parallel.py) casts each matmul
operand with a scale from the absolute max of the whole DTensor: the gathered input, the whole weight (its
shards' amaxes reduced) and the whole output gradient. The async styles hand this layer only its rank's
part of each tensor, then chunks of its rows. So the amaxes are reduced over the TP group once before the
first chunk (input and weight together in forward, the gradient in backward: one small all-reduce each),
and every chunk is cast with that scale by torchao's own helpers. The float8 values are then plain float8
TP's, bit for bit; products differ from it only by summation order.

Tensorwise scaling only: a rowwise-recipe layer (scales per row and per column, some spanning the whole
sequence) keeps the plain style, and says why through the protocol's `async_tp_unavailable`.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch import nn

from titan_float8.requirements import require_torchao

logger = logging.getLogger("titan.float8")

_CASTS = (
    "cast_config_input",
    "cast_config_weight",
    "cast_config_grad_output",
    "cast_config_input_for_grad_weight",
    "cast_config_weight_for_grad_input",
    "cast_config_grad_output_for_grad_weight",
)


def offer_async_tp_matmuls(model: nn.Module) -> dict[str, str]:
    """Mark every Float8Linear of `model` for titan-parallel's async TP styles: tensorwise layers get
    `async_tp_matmuls` (Float8Matmuls), the others `async_tp_unavailable` (the reason). Returns the
    reasons by layer name. Harmless without async TP: the plain and torchao styles ignore the marks."""
    require_torchao()
    from torchao.float8.float8_linear import Float8Linear

    unavailable = {}
    for fqn, module in model.named_modules():
        if not isinstance(module, Float8Linear):
            continue
        reason = _unsupported(module)
        if reason is None:
            module.async_tp_matmuls = Float8Matmuls
        else:
            module.async_tp_unavailable = unavailable[fqn] = reason
    if unavailable:
        logger.debug(f"float8: layers without async TP matmuls: {unavailable}")
    return unavailable


def _unsupported(layer: nn.Module) -> str | None:
    from torchao.float8.config import ScalingGranularity, ScalingType

    for name in _CASTS:
        cast = getattr(layer.config, name)
        dynamic = cast.scaling_type is ScalingType.DYNAMIC
        if not dynamic or cast.scaling_granularity is not ScalingGranularity.TENSORWISE:
            return (
                f"float8 {name} scales {cast.short_str()}; async TP's float8 matmuls need dynamic tensorwise "
                "scaling (float8.recipe='tensorwise')"
            )
    return None


class Float8Matmuls:
    """titan-parallel's LinearMatmuls for one Float8Linear's forward and backward (module docstring)."""

    def __init__(self, layer: nn.Module):
        self.config, self.mm_config = layer.config, layer.linear_mm_config

    def operands(self, x: torch.Tensor, weight: torch.Tensor) -> list[torch.Tensor]:
        # As Float8Linear.forward: under CUDA autocast the input in autocast's dtype; the weight as stored
        # (torchao casts it to float8 from its own precision).
        if torch.is_autocast_enabled("cuda"):
            x = x.to(torch.get_autocast_dtype("cuda"))
        return [x, weight]

    def begin_forward(self, x_part: torch.Tensor, weight: torch.Tensor, group) -> None:
        from torchao.float8.float8_training_tensor import GemmInputRole

        self.x_amax, self.weight_amax = _whole_amax((x_part, weight), group)
        c = self.config
        self.weight_t = self._cast(weight.t(), self.weight_amax, c.cast_config_weight, GemmInputRole.WEIGHT)

    def forward(self, x_rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        from torchao.float8.float8_training_tensor import GemmInputRole

        x = self._cast(_matrix(x_rows), self.x_amax, self.config.cast_config_input, GemmInputRole.INPUT)
        return torch.mm(x, self.weight_t).reshape(*x_rows.shape[:-1], -1)

    def begin_backward(self, grad_part: torch.Tensor, weight: torch.Tensor, group) -> None:
        from torchao.float8.float8_training_tensor import GemmInputRole

        (self.grad_amax,) = _whole_amax((grad_part,), group)
        cast = self.config.cast_config_weight_for_grad_input
        self.weight_t_for_grad = self._cast(weight.t(), self.weight_amax, cast, GemmInputRole.WEIGHT)

    def grad_input(self, grad_rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        from torchao.float8.float8_training_tensor import GemmInputRole

        cast = self.config.cast_config_grad_output
        grad = self._cast(_matrix(grad_rows), self.grad_amax, cast, GemmInputRole.GRAD_OUTPUT)
        return torch.mm(grad, self.weight_t_for_grad.t()).reshape(*grad_rows.shape[:-1], -1)

    def grad_weight(self, grad_rows: torch.Tensor, x_rows: torch.Tensor) -> torch.Tensor:
        from torchao.float8.float8_training_tensor import GemmInputRole

        c = self.config
        cast = c.cast_config_grad_output_for_grad_weight
        grad = self._cast(grad_rows, self.grad_amax, cast, GemmInputRole.GRAD_OUTPUT)
        x = self._cast(x_rows, self.x_amax, c.cast_config_input_for_grad_weight, GemmInputRole.INPUT)
        return torch.mm(grad.t(), x)

    def _cast(self, hp: torch.Tensor, amax: torch.Tensor, cast, role) -> torch.Tensor:
        """`hp` in float8 with the scale torchao derives from `amax` (that of the whole tensor)."""
        from torchao.float8.distributed_utils import tensor_already_casted_to_fp8
        from torchao.float8.float8_training_tensor import hp_tensor_and_scale_to_float8
        from torchao.float8.float8_utils import amax_to_scale

        if tensor_already_casted_to_fp8(hp):  # a weight FSDP all-gathered in float8: cast with its whole scale
            return hp
        scale = amax_to_scale(amax, cast.target_dtype, self.config.round_scales_to_power_of_2)
        return hp_tensor_and_scale_to_float8(hp, scale, cast.target_dtype, self.mm_config, role)


def _whole_amax(parts: tuple[torch.Tensor, ...], group) -> list[torch.Tensor]:
    """The absolute max of each whole tensor from this rank's part of it: one all-reduce for all of them."""
    from torchao.float8.distributed_utils import tensor_already_casted_to_fp8
    from torchao.float8.float8_utils import tensor_to_amax

    # float32 holds every bf16/fp16 amax exactly; a float8 weight's amax is unused (it is cast already).
    local = [
        torch.zeros((), device=p.device) if tensor_already_casted_to_fp8(p) else tensor_to_amax(p).float()
        for p in parts
    ]
    amax = torch.stack(local)
    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
    return list(amax.unbind())


def _matrix(rows: torch.Tensor) -> torch.Tensor:
    return rows.reshape(-1, rows.shape[-1])
