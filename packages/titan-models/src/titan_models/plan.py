"""What a parallelizer needs to know about a model, as plain data, and the tensor-parallel entries every
model here shares.

titan-parallel takes an nn.Module plus a ModelPlan and knows nothing else about the model; a trainer reads from it
which parameters a matrix optimizer (Muon) may take (`adamw_params`, `takes_matrix_optimizer`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle


LANGUAGE_MODEL_ADAMW_PARAMS = ("tok_embeddings", "output", "*norm*", "*bias")
"""ModelPlan.adamw_params of a language model's common parts: the token embedding, the output head, every norm
("attention_norm", "q_norm", "enorm", ...) and every bias ("wq.bias", GPT-OSS's "experts.w1_bias", ...)."""


@dataclass
class ModelPlan:
    block_fqns: list[str]
    """The repeated blocks, in order (e.g. "layers.0"): the unit of FSDP wrapping, activation
    checkpointing, per-block compile and pipeline splitting."""
    input_fqns: list[str]
    """Modules before the first block (e.g. "tok_embeddings"); they go to the first pipeline stage."""
    output_fqns: list[str]
    """Modules after the last block (e.g. "norm", "output"); they go to the last pipeline stage."""
    tp_plan: Callable[..., dict[str, ParallelStyle]]
    """Builds the tensor/sequence-parallel plan: {FQN pattern ("*" matches one name): style}. Takes keyword
    options such as loss_parallel. Styles are torch ParallelStyles or styles declared as data
    (`titan_models.tp_styles.ChannelShard`), which titan_parallel.apply_tp recognizes by duck typing
    (`parallel_style == "channel_shard"` plus a `sharded` tuple)."""
    shared_input_fqns: list[str] = field(default_factory=list)
    """Input modules the last pipeline stage uses too (a subset of input_fqns), e.g. "tok_embeddings" for the
    multi-token prediction modules, which embed shifted tokens, or for an output projection tied to it. The last
    stage holds a copy, drawn alike; a pipeline sums the two copies' gradients once per step, so they stay equal."""
    tp_divisible: dict[str, int] = field(default_factory=dict)
    """Sizes the tensor-parallel degree must divide, by their names in the model's args (e.g. {"n_heads": 16})."""
    attention_fqns: list[str] = field(default_factory=list)
    """FQN patterns ("*" matches one name) of the modules that compute attention from (q, k, v) alone
    ([bs, heads, seqlen, head_dim] each), e.g. "layers.*.attention.inner_attention". Context parallelism
    swaps them for ring attention. A model that also implements `set_positions(positions)` (the global
    positions of the tokens it is given) supports context parallelism. Empty for Hyena, whose long
    convolutions would need every earlier rank's inputs."""

    expert_fqns: list[str] = field(default_factory=list)
    """FQN patterns ("*" matches one name) of the routed-experts modules: parameters stacked per expert on
    dim 0, forward(rows, offsets) with rows sorted by expert and offsets[e] the end of expert e's rows, one
    output row per input row. Expert parallelism splits them over ranks by expert and moves their rows."""

    head_fqn: str | None = None
    """The output projection to the vocabulary (e.g. "output"): a Linear-like module (`weight` [vocab, dim],
    optional `bias`) whose output is the logits the loss reads. Declared, a parallelizer may compute it
    together with the loss, chunk by chunk, without materialising all the logits."""

    document_masking: bool = False
    """Whether the model's forward takes `document_ids` ([bs, seqlen]: block-causal attention within each
    packed document) and per-token `positions` ([bs, seqlen]: restarting at each document), so a trainer may
    mask packed documents from each other."""

    adamw_params: tuple[str, ...] = LANGUAGE_MODEL_ADAMW_PARAMS
    """Name patterns of the parameters a matrix optimizer (Muon) must not take, left to an element-wise one (AdamW):
    fnmatch globs, each matched against the whole name and against every dotted part of it ("output", "*norm*",
    "layers.0.*"). Name what is no hidden matrix though it has two or three dimensions: the embeddings, the output
    head, norms, biases (GPT-OSS's per-expert ones are [experts, hidden]), routers and gates (classifiers, as the
    head is), convolutions ([channels, 1, kernel] is no stack of matrices) and filters. Tensors of one dimension,
    or more than three, need no pattern (`takes_matrix_optimizer`). Each family declares its own: the decoder's
    from its args (decoder_adamw_params), Hyena's with its filters; the default is the part every language model
    here shares (LANGUAGE_MODEL_ADAMW_PARAMS). A trainer's configured patterns may replace them (titan-train:
    `optimizer.adamw_params`)."""

    @property
    def context_parallel(self) -> bool:
        """Whether the model computes correctly with the sequence split over ranks."""
        return bool(self.attention_fqns)


def takes_matrix_optimizer(name: str, ndim: int, adamw_params: tuple[str, ...] | list[str]) -> bool:
    """Whether a matrix optimizer (Muon) takes the parameter `name` of `ndim` dimensions: a matrix (2-D) or a stack
    of them (3-D, one matrix per expert) that no pattern of `adamw_params` names (ModelPlan.adamw_params)."""
    if ndim not in (2, 3):
        return False
    parts = name.split(".")
    return not any(fnmatch.fnmatchcase(name, p) or any(fnmatch.fnmatchcase(x, p) for x in parts) for p in adamw_params)


def embedding_and_head_tp_plan(loss_parallel: bool = True) -> dict[str, ParallelStyle]:
    """The tensor-parallel entries of a language model's ends, TorchTitan's: the token embedding row-wise into
    sequence-sharded activations (Shard(1)), the final norm sequence-parallel, and the output projection
    column-wise; with loss_parallel the logits stay sharded over the vocabulary for a loss-parallel cross
    entropy."""
    # Imported here: model code stays importable and usable without torch.distributed.
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    return {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        ),
    }


def feed_forward_tp_plan() -> dict[str, ParallelStyle]:
    """The entries of a block's SwiGLU (`layers.*.feed_forward`, after `layers.*.ffn_norm`), Megatron-style: the
    sequence-sharded input all-gathered, w1 / w3 column-wise, w2 row-wise reduce-scattered back over the
    sequence."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    return {
        "layers.*.ffn_norm": SequenceParallel(),
        "layers.*.feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "layers.*.feed_forward.w1": ColwiseParallel(),
        "layers.*.feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "layers.*.feed_forward.w3": ColwiseParallel(),
    }
