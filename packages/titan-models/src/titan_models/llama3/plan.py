"""How Llama 3 is split: block names and TorchTitan's tensor + sequence parallel plan."""

from __future__ import annotations

from typing import TYPE_CHECKING

from titan_models.llama3.args import Llama3Args
from titan_models.plan import ModelPlan

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle


def llama3_tp_plan(loss_parallel: bool = True) -> dict[str, ParallelStyle]:
    """TorchTitan's Llama plan (Megatron-style TP with sequence parallelism in between).

    Between blocks activations are sharded on the sequence dim (Shard(1)); attention and the MLP all-gather
    them, split heads / hidden units column-wise, and reduce-scatter back through the row-wise wo / w2.
    With loss_parallel the logits stay sharded over the vocabulary for a loss-parallel cross entropy.

    Tied embeddings need nothing more: the embedding (row-wise) and the output projection (column-wise)
    both shard the one matrix over the vocabulary, Shard(0), so Llama3.init_weights re-ties them as one
    parameter with one layout.
    """
    # Imported here: model code stays importable and usable without torch.distributed.
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    return {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        ),
        "layers.*.attention_norm": SequenceParallel(),
        # (x, freqs_cis): freqs_cis is passed through untouched.
        "layers.*.attention": PrepareModuleInput(
            input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
        ),
        "layers.*.attention.wq": ColwiseParallel(),
        "layers.*.attention.wk": ColwiseParallel(),
        "layers.*.attention.wv": ColwiseParallel(),
        "layers.*.attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "layers.*.ffn_norm": SequenceParallel(),
        "layers.*.feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "layers.*.feed_forward.w1": ColwiseParallel(),
        "layers.*.feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "layers.*.feed_forward.w3": ColwiseParallel(),
    }


DENSE_FEED_FORWARD = ("", ".w1", ".w2", ".w3")  # the entries of "layers.*.feed_forward" in llama3_tp_plan


def sparse_feed_forward_plan(plan: dict, args: Llama3Args) -> dict:
    """`plan` (llama3_tp_plan's entries) with the feed-forward entries per layer where some layers hold a mixture
    of experts: the dense SwiGLU's three Linear layers where a layer is dense, the whole layer split on its
    experts' (and shared experts') hidden units where it is sparse (ExpertsHiddenShard)."""
    from titan_models.tp_styles import ExpertsHiddenShard

    if args.moe is None:
        return plan
    dense = {suffix: plan.pop(f"layers.*.feed_forward{suffix}") for suffix in DENSE_FEED_FORWARD}
    for layer in range(args.n_layers):
        if args.is_sparse(layer):
            plan[f"layers.{layer}.feed_forward"] = ExpertsHiddenShard()
        else:
            plan.update({f"layers.{layer}.feed_forward{suffix}": style for suffix, style in dense.items()})
    return plan


def llama3_plan(args: Llama3Args) -> ModelPlan:
    return ModelPlan(
        block_fqns=[f"layers.{i}" for i in range(args.n_layers)],
        input_fqns=["tok_embeddings"],
        output_fqns=["norm", "output"],
        head_fqn="output",
        tp_plan=llama3_tp_plan,
        attention_fqns=["layers.*.attention.inner_attention"],
        document_masking=True,
        # Heads must split evenly (attention reshapes to local heads with -1), and so must the SwiGLU
        # hidden units (w1/w3 column shards feed w2's row shard as plain local tensors).
        tp_divisible={
            "n_heads": args.n_heads,
            "n_kv_heads": args.num_kv_heads,
            "ffn_hidden_dim": args.hidden_dim,
        },
    )
