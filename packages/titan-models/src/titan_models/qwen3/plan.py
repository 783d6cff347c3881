"""How Qwen3 and Qwen3-MoE are split: Llama 3's plan (same module names). Tensor parallelism of the
experts comes with expert parallelism; until then a sparse model refuses it by name."""

from __future__ import annotations

from titan_models.llama3.args import Llama3Args
from titan_models.llama3.plan import llama3_plan
from titan_models.plan import ModelPlan


def qwen3_plan(args: Llama3Args) -> ModelPlan:
    plan = llama3_plan(args)
    if args.moe is not None:
        plan.tp_plan = _no_tp_for_experts
        plan.expert_fqns = ["layers.*.feed_forward.experts"]  # sparse layers only: dense ones have none
    return plan


def _no_tp_for_experts(**options):
    raise ValueError(
        "tensor parallelism of mixture-of-experts layers is not supported yet; train qwen3_moe with "
        "parallelism.tensor_parallel_degree = 1 (FSDP / HSDP / CP / PP shard or split the experts instead)"
    )
