"""FSDP2 with float8 all-gather: the weight scales, computed once per step for all weights.

With float8.enable_fsdp_float8_all_gather, each Float8Linear weight is a tensor subclass whose FSDP2
pre-all-gather hook casts the local shard to float8 before communication. The cast needs the amax of the
*whole* weight, so without precompute every weight does its own small all-reduce of its amax at the start
of each forward. `precompute_float8_scales` does them all in one all-reduce right after the optimizer step
(the weights do not change until the next one) and hands each weight its scale.

On CPU (gloo): gloo has no float8 dtype. FSDP2 all-gathers a unit's inputs as raw bytes (uint8) when the
unit mixes dtypes, as every transformer block does (float8 linear weights plus high-precision norm
weights), and that works on gloo; a unit holding nothing but float8 weights would gather in float8, which
NCCL supports and gloo rejects with "Invalid scalar type".
"""

from __future__ import annotations

from torch import nn

from titan_float8.requirements import require_torchao


def precompute_float8_scales(model: nn.Module) -> None:
    """Compute the float8 scale of every FSDP-sharded float8 weight of `model` in one all-reduce.

    Call after each optimizer step (every rank, it is a collective) when
    float8.precompute_float8_dynamic_scale_for_fsdp is on. Does nothing for a model without float8
    all-gather weights.
    """
    require_torchao().precompute_float8_dynamic_scale_for_fsdp(model)
