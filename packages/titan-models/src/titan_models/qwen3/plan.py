"""How Qwen3 and Qwen3-MoE are split: Llama 3's plan (same module names), plus the per-head query and key norms,
and with the sparse layers' feed-forward tensor-parallel as a whole (ExpertsHiddenShard) instead of as three
Linear layers."""

from __future__ import annotations

from functools import partial

from titan_models.llama3.args import Llama3Args
from titan_models.llama3.plan import llama3_plan, llama3_tp_plan, sparse_feed_forward_plan
from titan_models.plan import ModelPlan


def qwen3_plan(args: Llama3Args) -> ModelPlan:
    plan = llama3_plan(args)
    plan.tp_plan = partial(qwen3_tp_plan, args)
    if args.moe is not None:
        plan.expert_fqns = ["layers.*.feed_forward.experts"]  # sparse layers only: dense ones have none
        plan.tp_divisible = {**plan.tp_divisible, "moe.hidden_dim": args.moe.hidden_dim}
    return plan


def qwen3_tp_plan(args: Llama3Args, loss_parallel: bool = True) -> dict:
    """Llama 3's plan, and:
    - q_norm / k_norm (one weight shared by all heads) see this rank's heads: sequence-parallel over the heads
      dim (2 of [bs, seqlen, heads, head_dim]), their weight replicated, its gradient summed over the ranks;
    - with experts, the feed-forward entries per layer (sparse_feed_forward_plan)."""
    # Imported here: model code stays importable and usable without torch.distributed.
    from torch.distributed.tensor.parallel import SequenceParallel

    plan = llama3_tp_plan(loss_parallel)
    if args.qk_norm:
        for norm in ("q_norm", "k_norm"):
            plan[f"layers.*.attention.{norm}"] = SequenceParallel(sequence_dim=2, use_local_output=True)
    return sparse_feed_forward_plan(plan, args)
