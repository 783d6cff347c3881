"""How the decoder is split: block names and TorchTitan's tensor + sequence parallel plan, with the entries its
variations (declared by its args) need: q/k norms, multi-head latent attention, attention sinks, sparse feed-forward
layers."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.mla_args import MLAArgs
from titan_models.linear_attention.args import GatedDeltaNetArgs
from titan_models.plan import LANGUAGE_MODEL_ADAMW_PARAMS, ModelPlan, embedding_and_head_tp_plan, feed_forward_tp_plan
from titan_models.tp_styles import ChannelShard, ExpertsHiddenShard, HeadsShareInput, ParameterShard

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle


def grouped_query_tp_plan(loss_parallel: bool = True) -> dict[str, ParallelStyle]:
    """TorchTitan's Llama plan (Megatron-style TP with sequence parallelism in between).

    Between blocks activations are sharded on the sequence dim (Shard(1)); attention and the MLP all-gather
    them, split heads / hidden units column-wise, and reduce-scatter back through the row-wise wo / w2.
    With loss_parallel the logits stay sharded over the vocabulary for a loss-parallel cross entropy.

    Tied embeddings need nothing more: the embedding (row-wise) and the output projection (column-wise)
    both shard the one matrix over the vocabulary, Shard(0), so Decoder.init_weights re-ties them as one
    parameter with one layout.
    """
    # Imported here: model code stays importable and usable without torch.distributed.
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    return {
        **embedding_and_head_tp_plan(loss_parallel),
        "layers.*.attention_norm": SequenceParallel(),
        # (x, freqs_cis): freqs_cis is passed through untouched.
        "layers.*.attention": PrepareModuleInput(
            input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
        ),
        "layers.*.attention.wq": ColwiseParallel(),
        "layers.*.attention.wk": ColwiseParallel(),
        "layers.*.attention.wv": ColwiseParallel(),
        "layers.*.attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        **feed_forward_tp_plan(),
    }


def decoder_tp_plan(args: DecoderArgs, loss_parallel: bool = True) -> dict:
    """grouped_query_tp_plan with the entries of the variations `args` declare:
    - q_norm / k_norm (qk_norm: one weight shared by all heads) see this rank's heads: sequence-parallel over
      the heads dim (2 of [bs, seqlen, heads, head_dim]), their weight replicated, its gradient summed;
    - multi-head latent attention's entries instead of grouped-query attention's (mla_tp_plan);
    - attention sinks (GPT-OSS: one logit per query head) sharded with their heads, Shard(0) as wq's output rows
      (ParameterShard, keyed by the parameter: "layers.*.attention" keeps its PrepareModuleInput). The q/k/v/o
      biases need no entry of their own: ColwiseParallel shards a Linear's bias with its output rows,
      RowwiseParallel replicates wo's and adds it once, after the reduction. A sliding window needs nothing: heads
      are independent, and every rank sees the whole sequence;
    - with linear-attention layers (Qwen3-Next), the token mixer's entries per layer: the attention's where a layer
      holds `attention`, the Gated DeltaNet's where it holds `linear_attn` (linear_attention_tp_plan), so no entry
      names a module a layer lacks;
    - with experts, the feed-forward entries per layer (sparse_feed_forward_plan; ExpertsHiddenShard splits the
      router's bias and the experts' biases too, and replicates Qwen3-Next's shared-expert gate, see
      titan_models.tp_styles);
    - with multi-token prediction, the MTP modules' entries (mtp_tp_plan)."""
    from torch.distributed.tensor.parallel import SequenceParallel

    plan = grouped_query_tp_plan(loss_parallel)
    if args.mla is not None:
        mla_tp_plan(plan, args.mla)
    elif args.qk_norm:
        for norm in ("q_norm", "k_norm"):
            plan[f"layers.*.attention.{norm}"] = SequenceParallel(sequence_dim=2, use_local_output=True)
    if args.attention_sinks:
        plan["layers.*.attention.sinks"] = ParameterShard(dim=0)
    return mtp_tp_plan(sparse_feed_forward_plan(token_mixer_plan(plan, args), args), args)


def token_mixer_plan(plan: dict, args: DecoderArgs) -> dict:
    """`plan` with the attention's entries per layer where some layers hold a Gated DeltaNet (`linear_attn`) instead,
    and those layers' linear_attention_tp_plan: a wildcard would name a module half the layers lack."""
    if args.layer_types is None or "linear_attention" not in args.layer_types:
        return plan
    attention = {
        key[len("layers.*.") :]: plan.pop(key)
        for key in list(plan)
        if key == "layers.*.attention" or key.startswith("layers.*.attention.")
    }
    linear = linear_attention_tp_plan(args.linear_attention)
    for layer in range(args.n_layers):
        entries = linear if args.is_linear_attention(layer) else attention
        plan.update({f"layers.{layer}.{key}": style for key, style in entries.items()})
    return plan


def linear_attention_tp_plan(linear: GatedDeltaNetArgs) -> dict:
    """A Gated DeltaNet's entries (relative to its block), split by key-head group, each rank its groups' key heads
    and their value heads, as attention splits heads:
    - the input gathers the sequence (Shard(1) -> Replicate, as the attention's);
    - in_proj_qkvz / in_proj_ba column-wise: their rows are interleaved by key-head group, each group's
      [q | k | v | z] and [b | a] contiguous (linear_attention.gated_deltanet), so a plain row split takes whole
      groups;
    - the convolution's channels are q | k | v de-interleaved, three blocks each split by head: ChannelShard with
      those blocks (its weight stored whole, read as this rank's part of each);
    - A_log / dt_bias, one per value head, sharded as the value heads (ParameterShard, keyed by the parameter);
    - the gated norm's weight, one per channel of a head and shared by all heads, replicated, its gradient summed
      (ChannelShard with nothing sharded);
    - out_proj row-wise back to the sequence-sharded residual, as wo."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

    blocks = (linear.key_dim, linear.key_dim, linear.value_dim)
    return {
        "linear_attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "linear_attn.in_proj_qkvz": ColwiseParallel(),
        "linear_attn.in_proj_ba": ColwiseParallel(),
        "linear_attn.conv1d": ChannelShard(sharded=("weight",), blocks=blocks),
        "linear_attn.A_log": ParameterShard(dim=0),
        "linear_attn.dt_bias": ParameterShard(dim=0),
        "linear_attn.norm": ChannelShard(sharded=()),
        "linear_attn.out_proj": RowwiseParallel(output_layouts=Shard(1)),
    }


def mtp_tp_plan(plan: dict, args: DecoderArgs) -> dict:
    """`plan` with the multi-token prediction modules' entries (decoder/mtp.py), where args.mtp_layers > 0:
    - enorm, hnorm and shared_head.norm run sequence-parallel, like the final norm: their inputs (the previous
      depth's hidden states, the embedding of the shifted tokens) arrive sequence-sharded as every block's do;
    - eh_proj is column-wise over [enorm(emb); hnorm(h)] (gathering the sequence) and hands its output back
      sequence-sharded (Shard(1)), the layout the block expects;
    - the block takes the entries of a block of its kind (the last layer's): "layers.*.X" and
      "layers.<last>.X" as "mtp.*.block.X".
    The shared head keeps its own entry: every depth's logits are vocab-sharded as the main ones."""
    if not args.mtp_layers:
        return plan
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, SequenceParallel

    mtp = {f"mtp.*.{norm}": SequenceParallel() for norm in ("enorm", "hnorm", "shared_head.norm")}
    mtp["mtp.*.eh_proj"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(1))
    for prefix in ("layers.*.", f"layers.{args.n_layers - 1}."):
        mtp.update(
            {"mtp.*.block." + key[len(prefix) :]: style for key, style in plan.items() if key.startswith(prefix)}
        )
    return {**plan, **mtp}


def mla_tp_plan(plan: dict, mla: MLAArgs) -> dict:
    """`plan` with multi-head latent attention's entries instead of grouped-query attention's:
    - the attention's input stays sequence-sharded (Shard(1));
    - the latent projections and their norms (wq_a, q_norm, wkv_a, kv_norm) run sequence-parallel: each rank
      its own tokens, weights replicated, their gradients summed over the ranks;
    - the head projections (wq or wq_b, and wkv_b) are column-wise, gathering their input's sequence: each
      rank computes its heads;
    - the rotary key, one head all heads read, is gathered whole, its gradient (each rank's heads' share)
      reduce-scattered (HeadsShareInput);
    - wo is row-wise back to the sequence-sharded residual, as in grouped-query attention."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, SequenceParallel

    for name in ("wq", "wk", "wv"):
        plan.pop(f"layers.*.attention.{name}")
    plan["layers.*.attention"] = PrepareModuleInput(
        input_layouts=(Shard(1), None), desired_input_layouts=(Shard(1), None)
    )
    heads = ("wkv_b", "wq") if mla.q_lora_rank is None else ("wkv_b", "wq_b")
    latent = ("wkv_a", "kv_norm") if mla.q_lora_rank is None else ("wkv_a", "kv_norm", "wq_a", "q_norm")
    plan.update({f"layers.*.attention.{name}": ColwiseParallel(input_layouts=Shard(1)) for name in heads})
    plan.update({f"layers.*.attention.{name}": SequenceParallel() for name in latent})
    plan["layers.*.attention.rope_key"] = HeadsShareInput()
    return plan


DENSE_FEED_FORWARD = ("", ".w1", ".w2", ".w3")  # the entries of "layers.*.feed_forward" in grouped_query_tp_plan


def sparse_feed_forward_plan(plan: dict, args: DecoderArgs) -> dict:
    """`plan` (grouped_query_tp_plan's entries) with the feed-forward entries per layer where some layers hold a
    mixture of experts: the dense SwiGLU's three Linear layers where a layer is dense, the whole layer split on
    its experts' (and shared experts') hidden units where it is sparse (ExpertsHiddenShard)."""
    if args.moe is None:
        return plan
    dense = {suffix: plan.pop(f"layers.*.feed_forward{suffix}") for suffix in DENSE_FEED_FORWARD}
    for layer in range(args.n_layers):
        if args.is_sparse(layer):
            plan[f"layers.{layer}.feed_forward"] = ExpertsHiddenShard()
        else:
            plan.update({f"layers.{layer}.feed_forward{suffix}": style for suffix, style in dense.items()})
    return plan


def decoder_plan(args: DecoderArgs) -> ModelPlan:
    """The plan of the decoder `args` describe: its blocks, attention kernels for context parallelism, routed
    experts for expert parallelism, and the sizes tensor parallelism must divide."""
    # Heads must split evenly (attention reshapes to local heads with -1), and so must the SwiGLU hidden units
    # (w1/w3 column shards feed w2's row shard as plain local tensors), the experts' and the shared experts'.
    divisible = {"n_heads": args.n_heads}
    if args.mla is None:
        divisible["n_kv_heads"] = args.num_kv_heads
    divisible["ffn_hidden_dim"] = args.hidden_dim
    if args.layer_types is not None and "linear_attention" in args.layer_types:
        # Split by key-head group (linear_attention_tp_plan); the value heads follow, a multiple of the key heads.
        divisible["linear_attention.n_key_heads"] = args.linear_attention.n_key_heads
    if args.moe is not None:
        divisible["moe.hidden_dim"] = args.moe.hidden_dim
        if args.moe.num_shared_experts:
            divisible["moe.num_shared_experts x moe.hidden_dim"] = args.moe.num_shared_experts * args.moe.hidden_dim
    return ModelPlan(
        block_fqns=[f"layers.{i}" for i in range(args.n_layers)],
        input_fqns=["tok_embeddings"],
        output_fqns=["norm", "output", *(["mtp"] if args.mtp_layers else [])],
        # The MTP modules embed shifted tokens; a tied output projection is the embedding.
        shared_input_fqns=["tok_embeddings"] if args.mtp_layers or args.tie_word_embeddings else [],
        head_fqn="output",
        tp_plan=partial(decoder_tp_plan, args),
        # The MTP modules' blocks attend over the sequence too (context parallelism's ring).
        attention_fqns=["layers.*.attention.inner_attention"]
        + (["mtp.*.block.attention.inner_attention"] if args.mtp_layers else []),
        expert_fqns=_expert_fqns(args),
        document_masking=True,
        tp_divisible=divisible,
        adamw_params=decoder_adamw_params(args),
    )


def decoder_adamw_params(args: DecoderArgs) -> tuple[str, ...]:
    """The parameters a matrix optimizer must not take (ModelPlan.adamw_params): a language model's embedding, head,
    norms and biases, with those of the variations `args` declare:
    - the router of a mixture of experts ("router": its gate [experts, dim] scores experts, a classifier as the head
      is) and the shared experts' gate ("shared_expert_gate" [1, dim], a scalar per token);
    - attention sinks ("sinks", one logit per head; 1-D, named so the rule does not hang on their shape);
    - the linear-attention layers' depthwise convolution ("conv1d" [channels, 1, kernel]: 3-D, yet no stack of
      matrices; A_log and dt_bias are 1-D).
    The multi-token prediction modules need nothing more: their norms match "*norm*", eh_proj is a hidden matrix."""
    extra = []
    if args.moe is not None:
        extra.append("router")
        if args.moe.shared_expert_gate:
            extra.append("shared_expert_gate")
    if args.attention_sinks:
        extra.append("sinks")
    if args.layer_types is not None and "linear_attention" in args.layer_types:
        extra.append("conv1d")
    return (*LANGUAGE_MODEL_ADAMW_PARAMS, *extra)


def _expert_fqns(args: DecoderArgs) -> list[str]:
    """The routed experts: sparse layers' (dense ones have none), and the multi-token prediction modules' where their
    block is sparse (the kind of the last layer)."""
    if args.moe is None:
        return []
    mtp = ["mtp.*.block.feed_forward.experts"] if args.mtp_layers and args.is_sparse(args.n_layers - 1) else []
    return ["layers.*.feed_forward.experts", *mtp]
