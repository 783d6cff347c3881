"""How Hyena is split: block names and a tensor + sequence parallel plan that shards channels.

Hyena mixes positions per channel (the short and the long convolutions, the gates), so tensor parallelism
splits channels, Megatron-style: in_proj column-wise, out_proj row-wise, and the channel-wise modules in
between keep their own channels' parameters. Two layout choices make that exact:

- in_proj's output is channel-major ([c * (N + 1) + g] for channel c, stream g), so a contiguous
  column shard holds every stream x_0..x_{N-1}, v of its channels: the split stays consistent.
- The filters are channel-major too ([c * (N - 1) + i]); the filter MLP shared by all channels is
  replicated, and its gradient, computed by each rank for its own channels, is summed over the ranks.

The channel-wise modules (the short convolution, the implicit filter) are declared as ChannelShard
(titan_models.tp_styles): titan-parallel shards their per-channel tensors and has them read plain local
tensors, so the model code computes on its own channels without knowing it is split.

Between blocks activations are sharded over the sequence (Shard(1)) as for Llama; the mixer all-gathers
them, since a long convolution needs the whole sequence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from titan_models.hyena.args import HyenaArgs
from titan_models.plan import LANGUAGE_MODEL_ADAMW_PARAMS, ModelPlan, embedding_and_head_tp_plan, feed_forward_tp_plan
from titan_models.tp_styles import ChannelShard

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle


def hyena_tp_plan(loss_parallel: bool = True) -> dict[str, ParallelStyle | ChannelShard]:
    """Tensor + sequence parallel plan, keyed by FQN pattern (see the module docstring)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    return {
        **embedding_and_head_tp_plan(loss_parallel),
        "layers.*.mixer_norm": SequenceParallel(),
        "layers.*.mixer": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "layers.*.mixer.in_proj": ColwiseParallel(),
        "layers.*.mixer.short_filter": ChannelShard(("weight", "bias")),
        "layers.*.mixer.filter": ChannelShard(("out.weight", "skip", "decay_rates")),
        "layers.*.mixer.out_proj": RowwiseParallel(output_layouts=Shard(1)),
        **feed_forward_tp_plan(),
    }


HYENA_ADAMW_PARAMS = (*LANGUAGE_MODEL_ADAMW_PARAMS, "filter", "short_filter")
"""ModelPlan.adamw_params of Hyena: a language model's, and the filters: the short convolution ([channels, kernel])
and the implicit filter (a convolution over time, and the small network that makes it: no hidden matrices)."""


def hyena_plan(args: HyenaArgs) -> ModelPlan:
    return ModelPlan(
        block_fqns=[f"layers.{i}" for i in range(args.n_layers)],
        input_fqns=["tok_embeddings"],
        output_fqns=["norm", "output"],
        tp_plan=hyena_tp_plan,
        # Channels must split evenly (the operator views its local channels as [-1, N + 1] and [-1, N - 1]),
        # and so must the SwiGLU hidden units.
        tp_divisible={"dim": args.dim, "ffn_hidden_dim": args.hidden_dim},
        adamw_params=HYENA_ADAMW_PARAMS,
    )
