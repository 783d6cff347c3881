"""How Hyena is split: block names and a tensor + sequence parallel plan that shards channels.

Hyena mixes positions per channel (the short and the long convolutions, the gates), so tensor parallelism
splits channels, Megatron-style: in_proj column-wise, out_proj row-wise, and the channel-wise modules in
between keep their own channels' parameters. Two layout choices make that exact:

- in_proj's output is channel-major ([c * (N + 1) + g] for channel c, stream g), so a contiguous
  column shard holds every stream x_0..x_{N-1}, v of its channels: the split stays consistent.
- The filters are channel-major too ([c * (N - 1) + i]); the filter MLP shared by all channels is
  replicated, and its gradient, computed by each rank for its own channels, is summed by DTensor.

Between blocks activations are sharded over the sequence (Shard(1)) as for Llama; the mixer all-gathers
them, since a long convolution needs the whole sequence.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from torch import nn

from titan_models.hyena.args import HyenaArgs
from titan_models.plan import ModelPlan

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle


@functools.cache
def _channel_parallel_cls() -> type:
    """The ParallelStyle class, built on first use: model code imports no torch.distributed at import time."""
    from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor
    from torch.distributed.tensor.parallel import ParallelStyle

    class ChannelParallel(ParallelStyle):
        """Shard the named parameters and buffers of a channel-wise module on dim 0 (its channels) and
        replicate the rest. Inputs and outputs stay plain local tensors: the module computes on its own
        channels, reading its parameters through titan_models.hyena.sharding.local."""

        def __init__(self, sharded: tuple[str, ...]):
            super().__init__()
            self.sharded = frozenset(sharded)

        def _partition(self, prefix: str, module: nn.Module, mesh) -> None:
            def placement(name: str):
                return [Shard(0) if (f"{prefix}.{name}" if prefix else name) in self.sharded else Replicate()]

            for name, param in list(module.named_parameters(recurse=False)):
                dparam = nn.Parameter(distribute_tensor(param, mesh, placement(name), src_data_rank=self.src_data_rank))
                module.register_parameter(name, dparam)
            for name, buffer in list(module.named_buffers(recurse=False)):
                persistent = name not in module._non_persistent_buffers_set
                dbuffer = distribute_tensor(buffer, mesh, placement(name), src_data_rank=self.src_data_rank)
                module.register_buffer(name, dbuffer, persistent=persistent)

        def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
            return distribute_module(module, device_mesh, self._partition)

    return ChannelParallel


def hyena_tp_plan(loss_parallel: bool = True) -> dict[str, ParallelStyle]:
    """Tensor + sequence parallel plan, keyed by FQN pattern (see the module docstring)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    channel_parallel = _channel_parallel_cls()
    return {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        ),
        "layers.*.mixer_norm": SequenceParallel(),
        "layers.*.mixer": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "layers.*.mixer.in_proj": ColwiseParallel(),
        "layers.*.mixer.short_filter": channel_parallel(("weight", "bias")),
        "layers.*.mixer.filter": channel_parallel(("out.weight", "skip", "decay_rates")),
        "layers.*.mixer.out_proj": RowwiseParallel(output_layouts=Shard(1)),
        "layers.*.ffn_norm": SequenceParallel(),
        "layers.*.feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "layers.*.feed_forward.w1": ColwiseParallel(),
        "layers.*.feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "layers.*.feed_forward.w3": ColwiseParallel(),
    }


def hyena_plan(args: HyenaArgs) -> ModelPlan:
    return ModelPlan(
        block_fqns=[f"layers.{i}" for i in range(args.n_layers)],
        input_fqns=["tok_embeddings"],
        output_fqns=["norm", "output"],
        tp_plan=hyena_tp_plan,
        # Channels must split evenly (the operator views its local channels as [-1, N + 1] and [-1, N - 1]),
        # and so must the SwiGLU hidden units.
        tp_divisible={"model.dim": args.dim, "model.ffn_hidden_dim": args.hidden_dim},
    )
