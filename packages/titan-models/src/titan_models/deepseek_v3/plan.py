"""How DeepSeek-V3 is split: Llama 3's block names and plan, with MLA's attention (no tensor parallelism of it
yet) and the MoE layers' routed experts for expert parallelism."""

from __future__ import annotations

from titan_models.llama3.args import Llama3Args
from titan_models.llama3.plan import llama3_plan
from titan_models.plan import ModelPlan


def deepseek_v3_plan(args: Llama3Args) -> ModelPlan:
    plan = llama3_plan(args)
    plan.tp_plan = _no_tensor_parallel
    plan.tp_divisible = {"n_heads": args.n_heads}
    plan.expert_fqns = ["layers.*.feed_forward.experts"]
    return plan


def _no_tensor_parallel(loss_parallel: bool = True) -> dict:
    raise ValueError(
        "tensor parallelism of multi-head latent attention (DeepSeek-V3) is not supported yet; use "
        "parallelism.tensor_parallel_degree = 1 (FSDP, expert, pipeline and context parallelism apply)"
    )
