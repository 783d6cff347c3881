"""Tensor-parallel styles a model's plan declares as plain data, for what torch's ParallelStyles do not cover.

titan-models imports torch only, so it cannot build titan-parallel's styles; it names them instead, and
titan_parallel.apply_tp turns each declaration into the style (matching `parallel_style`, not the class).
A declaration is keyed by a module's FQN, except ParameterShard's, keyed by a parameter's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class ChannelShard:
    """For a module that computes each channel on its own (a depthwise convolution, per-channel filters):
    shard the tensors named in `sharded` (parameters and buffers, relative to the module, e.g.
    "out.weight") on dim 0, their channel dim; replicate the module's other tensors. The module's forward
    then reads plain local tensors, this rank's channels, and gets this rank's channels as input.
    titan-parallel applies it as ChannelParallel.

    `blocks` (sizes summing to the channel dim): the channels are these blocks side by side, each split over the
    ranks on its own (Qwen3-Next's convolution over q | k | v: a rank's input is its part of q, of k and of v).
    No DTensor placement lays that out, so the sharded tensors are then stored replicated and read as this rank's
    part of each block, their gradients (this rank's channels) summed over the ranks. Empty: one block."""

    sharded: tuple[str, ...]
    blocks: tuple[int, ...] = ()
    parallel_style: ClassVar[str] = "channel_shard"

    def __post_init__(self):
        if isinstance(self.sharded, str) or not all(isinstance(name, str) for name in self.sharded):
            raise TypeError(f"ChannelShard(sharded={self.sharded!r}) needs a tuple of names, e.g. ('weight', 'bias')")
        object.__setattr__(self, "sharded", tuple(self.sharded))
        if not all(isinstance(size, int) and not isinstance(size, bool) and size > 0 for size in self.blocks):
            raise TypeError(f"ChannelShard(blocks={self.blocks!r}) needs positive int sizes, e.g. (64, 64, 128)")
        object.__setattr__(self, "blocks", tuple(self.blocks))


@dataclass(frozen=True)
class ExpertsHiddenShard:
    """For a mixture-of-experts layer (titan_models.moe.MoE: `router.gate.weight`, and `experts.w1` / `w3`
    [experts, dim, hidden], `w2` [experts, hidden, dim]) between sequence-parallel activations: every rank
    routes the whole sequence with the replicated router and computes every expert on its slice of the
    hidden units (w1 / w3 sharded on dim 2, w2 on dim 1), so the layer's output is a partial sum that is
    reduce-scattered back over the sequence, as a row-wise projection's is. The layer reads plain local
    tensors (`local_tensor`). With GPT-OSS's biases: the router's `gate.bias` is replicated like its weight,
    `experts.w1_bias` / `w3_bias` [experts, hidden] are split on hidden like w1 / w3, and `experts.w2_bias`
    [experts, dim] is replicated and added on one rank only (the output is a partial sum, reduced once).
    titan-parallel applies it as MoETensorParallel."""

    parallel_style: ClassVar[str] = "experts_hidden_shard"


@dataclass(frozen=True)
class HeadsShareInput:
    """For a module whose input is sequence-sharded between blocks and read alike by every attention head (MLA's
    rotary key, one head for all): every rank gathers the whole sequence; the gradient it computes is its own
    heads' share, a partial sum, reduce-scattered back over the sequence. The module's output is a plain local
    tensor. titan-parallel applies it as SharedInputParallel."""

    parallel_style: ClassVar[str] = "heads_share_input"


@dataclass(frozen=True)
class ParameterShard:
    """For one parameter that follows the heads (GPT-OSS's attention sinks [n_heads]): its plan key names the
    parameter, not a module ("layers.*.attention.sinks"), and it is sharded on `dim` as the heads are (Shard(0),
    as a column-wise wq splits its output rows), so each rank reads this rank's heads' part as a plain local
    tensor. Keyed by the parameter, it leaves the owner module's own entry (a PrepareModuleInput on
    "layers.*.attention") in place. titan-parallel applies it as ShardParameters on the owner module."""

    dim: int = 0
    parallel_style: ClassVar[str] = "parameter_shard"

    def __post_init__(self):
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 0:
            raise TypeError(f"ParameterShard(dim={self.dim!r}) needs a dim >= 0, e.g. 0 for a per-head parameter")
