"""The layout of a run: every decision about how the model is parallelized, resolved once and frozen.

A trainer builds a `Layout` from its config before any process group exists (checking everything there
is to check), and `build_parallel_model` reads nothing else. Decisions that follow from several settings
are made here, once, as values: which data-parallel wrapper (and whether it casts parameters, so autocast
is or is not needed), how coarse activation checkpointing is, whether the loss runs on vocab-sharded
logits. Downstream code reads the field; it never re-derives it from degrees.
"""

from dataclasses import dataclass
from enum import Enum

import torch

from titan_parallel.ac.activation_checkpoint import check_ac_options
from titan_parallel.mesh.parallel_dims import ParallelDims
from titan_parallel.pp.pipeline_plan import PipelinePlan


class DataParallel(Enum):
    """The data-parallel wrapper, chosen from the degrees and the implementation asked for."""

    NONE = "none"
    FSDP2 = "fsdp2"
    """fully_shard over dp_shard x cp; HSDP when dp_replicate > 1 too."""
    DDP = "ddp"
    """replicate over dp_replicate (no sharding)."""
    SIMPLE_FSDP = "simple_fsdp"
    """SimpleFSDP, in the mode `Layout.simple_fsdp_mode` (fully_shard, replicate or hybrid_shard)."""

    @property
    def casts_params(self) -> bool:
        """Whether the wrapper gathers parameters in the compute dtype itself (else autocast must)."""
        return self in (DataParallel.FSDP2, DataParallel.SIMPLE_FSDP)


class ACGranularity(Enum):
    """How much activation checkpointing recomputes."""

    NONE = "none"
    OP = "op"
    """Per-op selective: keep matmul and attention outputs, recompute the rest."""
    BLOCK = "block"
    """Whole blocks: every block (full) or every Nth (selective N)."""
    AUTO = "auto"
    """Per block, chosen to fit a memory budget (ac_budget.py): none, per-op or whole block."""


@dataclass(frozen=True)
class ActivationCheckpoint:
    mode: str
    """"none", "selective" or "full" (apply_ac's mode)."""
    selective_option: str = "op"
    """"op" or an integer N as a string (every Nth block)."""
    memory_budget_gib: float = 0.0
    """mode "auto": the peak to fit (parameters, optimizer state, the step's tensors); 0: the device's capacity."""
    trace_batch: tuple[int, int] = (0, 0)
    """mode "auto": (sequences, tokens per sequence) of one micro-batch on one rank, the traced step's input."""
    auto_policies: tuple[str, ...] = ("none", "op", "full")
    """mode "auto": the per-block policies it may choose from (e.g. no "full" where compiled blocks refuse it)."""
    optimizer_bytes_per_param: int = 0
    """mode "auto": optimizer state per parameter element (AdamW in float32: 8), added to the prediction."""

    def __post_init__(self):
        check_ac_options(self.mode, self.selective_option)
        if self.mode == "auto" and min(self.trace_batch) <= 0:
            raise ValueError(f"mode='auto' needs trace_batch=(sequences, tokens) > 0, got {self.trace_batch}")
        if self.memory_budget_gib < 0:
            raise ValueError(f"memory_budget_gib={self.memory_budget_gib} must be >= 0 (0: the device's capacity)")

    @property
    def granularity(self) -> ACGranularity:
        if self.mode == "none":
            return ACGranularity.NONE
        if self.mode == "auto":
            return ACGranularity.AUTO
        return ACGranularity.OP if self.mode == "selective" and self.selective_option == "op" else ACGranularity.BLOCK


@dataclass(frozen=True)
class ContextParallel:
    variant: str = "p2p"
    """"p2p" (ring of point-to-point hops) or "allgather"."""
    implementation: str = "titan"
    """"titan" (any device) or "torch" (CUDA only)."""
    seq_len: int = 0
    """The whole sequence length; each rank holds 2 load-balanced chunks of seq_len / (2 cp)."""


@dataclass(frozen=True)
class SimpleFSDPOptions:
    mode: str
    """"fully_shard", "replicate" or "hybrid_shard"."""
    overlap: str = "none"
    """Inductor bucketing/reordering of its collectives (see simple_fsdp_overlap.py)."""
    manual_buckets: tuple[str, ...] = ()


@dataclass(frozen=True)
class Layout:
    dims: ParallelDims
    accumulation_steps: int
    """Local batches per optimizer step on each data-parallel rank."""
    data_parallel: DataParallel = DataParallel.NONE
    param_dtype: torch.dtype = torch.float32
    """The compute dtype: data-parallel wrappers gather parameters in it, or autocast computes in it."""
    reduce_dtype: torch.dtype = torch.float32
    """The dtype gradients are reduced in across data-parallel ranks."""
    reshard_after_forward: str = "default"
    """FSDP: "default" (not under pipelining), "always" or "never"."""
    simple_fsdp: SimpleFSDPOptions | None = None
    """Set when data_parallel is SIMPLE_FSDP."""
    loss_parallel: bool = False
    """The output layer leaves logits sharded over the vocabulary and the loss is computed on them."""
    async_tensor_parallel: str | None = None
    """With TP: None (plain), "titan" (eager micro-pipelined styles) or "symmetric_memory" (inductor's pass)."""
    loss_chunk_tokens: int = 0
    """> 0: the output head and cross entropy run this many tokens at a time (chunked_loss.py); 0: the plain
    loss on all the logits. `auto_loss_chunk_tokens` gives a size from the micro-batch and the head."""
    loss_chunk_gradients: str = "in_forward"
    """How the chunked loss gets its gradients: "in_forward" (computed with the loss, scaled in backward) or
    "recompute" (each chunk's logits recomputed in backward: one more head matmul)."""
    activation_checkpoint: ActivationCheckpoint = ActivationCheckpoint("none")
    compile_backend: str | None = None
    """torch.compile backend of each block; None: eager."""
    pipeline: PipelinePlan | None = None
    """None without pipeline parallelism."""
    context_parallel: ContextParallel | None = None
    """None without context parallelism."""

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype to autocast the compute to; None where nothing needs it (float32, or a wrapper casts)."""
        if self.param_dtype == torch.float32 or self.data_parallel.casts_params:
            return None
        return self.param_dtype

    def describe(self) -> str:
        text = f"{self.dims.describe()}, gradient accumulation {self.accumulation_steps}"
        if self.pipeline is not None:
            text += f", {self.pipeline.describe()}"
        if self.async_tensor_parallel is not None:
            text += f", async TP ({self.async_tensor_parallel})"
        if self.loss_chunk_tokens:
            gradients = "in forward" if self.loss_chunk_gradients == "in_forward" else "recomputed"
            # Not "loss": scripts pick the step lines out of the log by that word.
            text += f", cross entropy in chunks of {self.loss_chunk_tokens} tokens (gradients {gradients})"
        return text
