"""How DeepSeek-V3 is split: Llama 3's block names and plan, with multi-head latent attention's own
tensor-parallel entries, the sparse layers split as a whole (experts and shared experts on their hidden
units), and the routed experts named for expert parallelism."""

from __future__ import annotations

from functools import partial

from titan_models.llama3.args import Llama3Args
from titan_models.llama3.plan import llama3_plan, llama3_tp_plan, sparse_feed_forward_plan
from titan_models.plan import ModelPlan
from titan_models.tp_styles import HeadsShareInput


def deepseek_v3_plan(args: Llama3Args) -> ModelPlan:
    plan = llama3_plan(args)
    plan.tp_plan = partial(deepseek_v3_tp_plan, args)
    shared = args.moe.num_shared_experts * args.moe.hidden_dim
    plan.tp_divisible = {"n_heads": args.n_heads, "ffn_hidden_dim": args.hidden_dim,
                         "moe.hidden_dim": args.moe.hidden_dim,
                         **({"moe.num_shared_experts x moe.hidden_dim": shared} if shared else {})}  # fmt: skip
    plan.expert_fqns = ["layers.*.feed_forward.experts"]
    return plan


def deepseek_v3_tp_plan(args: Llama3Args, loss_parallel: bool = True) -> dict:
    """Llama 3's plan with MLA's attention entries instead of grouped-query attention's:
    - the attention's input stays sequence-sharded (Shard(1));
    - the latent projections and their norms (wq_a, q_norm, wkv_a, kv_norm) run sequence-parallel: each rank
      its own tokens, weights replicated, their gradients summed over the ranks;
    - the head projections (wq or wq_b, and wkv_b) are column-wise, gathering their input's sequence: each
      rank computes its heads;
    - the rotary key, one head all heads read, is gathered whole, its gradient (each rank's heads' share)
      reduce-scattered (HeadsShareInput);
    - wo is row-wise back to the sequence-sharded residual, as in Llama."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, SequenceParallel

    plan = llama3_tp_plan(loss_parallel)
    for name in ("wq", "wk", "wv"):
        plan.pop(f"layers.*.attention.{name}")
    plan["layers.*.attention"] = PrepareModuleInput(
        input_layouts=(Shard(1), None), desired_input_layouts=(Shard(1), None)
    )
    heads = ("wkv_b", "wq") if args.mla.q_lora_rank is None else ("wkv_b", "wq_b")
    latent = ("wkv_a", "kv_norm") if args.mla.q_lora_rank is None else ("wkv_a", "kv_norm", "wq_a", "q_norm")
    plan.update({f"layers.*.attention.{name}": ColwiseParallel(input_layouts=Shard(1)) for name in heads})
    plan.update({f"layers.*.attention.{name}": SequenceParallel() for name in latent})
    plan["layers.*.attention.rope_key"] = HeadsShareInput()
    return sparse_feed_forward_plan(plan, args)
