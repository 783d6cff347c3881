"""Parallelism for Titan, applied to any module from its plan data (it knows nothing of any model).

- `build_parallel_model` -> `ParallelModel`: the whole apply order in one place, and the model as this rank
  runs it (forward_backward, forward_loss, clip_grad_norm_, mean_loss, after_optimizer_step), from a frozen
  `Layout` (`DataParallel`, `ACGranularity`, `ActivationCheckpoint`, `ContextParallel`, `SimpleFSDPOptions`);
  `ModelConverter` is the hook for transforms from other packages (float8).
- `device_type`, `device_module`, `distributed_backend`: the one place that picks the device and backend.
- Errors name the parameters a caller set (`schedule=`, `tp=`), or what its users call them: a trainer maps
  them once, as data, with `option_names({"tp": "parallelism.tensor_parallel_degree", ...})`.
- `ParallelDims`: the degrees (dp_replicate x dp_shard x cp x tp x pp = world size) and the named mesh.
- The parallelisms, one file each, usable alone: `apply_tp` (+ `check_tp_degree`, `loss_context`; plan values
  are ParallelStyles or styles declared as data: `parallel_style='channel_shard'` -> `ChannelParallel`,
  `parallel_style='experts_hidden_shard'` -> `MoETensorParallel`, `parallel_style='heads_share_input'` ->
  `SharedInputParallel`, `parallel_style='parameter_shard'` keyed by a parameter -> `ShardParameters` on its owner),
  `apply_cp` (+ `shard_sequence` / `unshard_sequence` / `load_balanced_positions`, `ring_attention`),
  `apply_ac`, `apply_compile`, `apply_fsdp` / `apply_ddp`, `apply_simple_fsdp` (`SIMPLE_FSDP_MODES`,
  `sharded_params`, `enable_overlap` with `OVERLAP_MODES`), `clip_grad_norm_`.
- Async TP (`apply_tp(..., async_tp=)`): `AsyncColwiseParallel` / `AsyncRowwiseParallel`, `async_tp_plan`,
  `symmetric_memory_unavailable`, `ASYNC_TP_IMPLEMENTATIONS`; the chunked ops `all_gather_matmul`,
  `matmul_reduce_scatter`.
- `Muon`: a torch Optimizer, Muon on matrices and expert stacks (plain or DTensor, orthogonalized whole
  whatever the placements), AdamW on the groups with `use_muon=False`.
- Pipeline parallel: `plan_pipeline` -> `PipelinePlan` (every check, no process group; `SCHEDULES`), then
  `build_pipeline` -> `Pipeline.step`.
- The loss (`Layout(loss_chunk_tokens=)`: `check_loss_chunking`, `auto_loss_chunk_tokens`): labels equal to
  `IGNORE_INDEX` (-100, F.cross_entropy's default) add nothing to it, so a trainer's data marks the tokens it does
  not learn with that value.
"""

from titan_parallel.ac.activation_checkpoint import apply_ac, check_ac_options, compiled_block_ac_refusal
from titan_parallel.cp.context_parallel import (
    RingAttention,
    apply_cp,
    load_balanced_positions,
    shard_sequence,
    unshard_sequence,
)
from titan_parallel.cp.ring_attention import ring_attention
from titan_parallel.fsdp.data_parallel import apply_ddp, apply_fsdp
from titan_parallel.fsdp.simple_fsdp import MODES as SIMPLE_FSDP_MODES
from titan_parallel.fsdp.simple_fsdp import apply_simple_fsdp
from titan_parallel.fsdp.simple_fsdp_overlap import OVERLAP_MODES, enable_overlap
from titan_parallel.loss.chunked_loss import auto_loss_chunk_tokens, check_loss_chunking
from titan_parallel.loss.gradients_in_forward import IGNORE_INDEX
from titan_parallel.mesh.device import device_module, device_type, distributed_backend
from titan_parallel.mesh.parallel_dims import ParallelDims
from titan_parallel.model.applied_layout import describe_applied, format_applied
from titan_parallel.model.clip_grad import clip_grad_norm_
from titan_parallel.model.compile import apply_compile
from titan_parallel.model.layout import (
    ACGranularity,
    ActivationCheckpoint,
    ContextParallel,
    DataParallel,
    Layout,
    SimpleFSDPOptions,
)
from titan_parallel.model.parallel_model import ModelConverter, ParallelModel, build_parallel_model
from titan_parallel.optim.muon import Muon
from titan_parallel.options.option_names import option_names
from titan_parallel.params.stored_params import sharded_params
from titan_parallel.pp.pipeline import Pipeline, build_pipeline
from titan_parallel.pp.pipeline_plan import SCHEDULES, ZERO_BUBBLE, PipelinePlan, plan_pipeline
from titan_parallel.tp.async_tensor_parallel import IMPLEMENTATIONS as ASYNC_TP_IMPLEMENTATIONS
from titan_parallel.tp.async_tensor_parallel import (
    AsyncColwiseParallel,
    AsyncRowwiseParallel,
    async_tp_plan,
    symmetric_memory_unavailable,
)
from titan_parallel.tp.async_tp_ops import all_gather_matmul, matmul_reduce_scatter
from titan_parallel.tp.channel_parallel import ChannelParallel
from titan_parallel.tp.moe_parallel import MoETensorParallel
from titan_parallel.tp.parameter_shard import ShardParameters
from titan_parallel.tp.shared_input import SharedInputParallel
from titan_parallel.tp.tensor_parallel import apply_tp, check_tp_degree, loss_context

__version__ = "0.29.5"

__all__ = [
    "ACGranularity",
    "ASYNC_TP_IMPLEMENTATIONS",
    "AsyncColwiseParallel",
    "AsyncRowwiseParallel",
    "all_gather_matmul",
    "async_tp_plan",
    "matmul_reduce_scatter",
    "symmetric_memory_unavailable",
    "ActivationCheckpoint",
    "ChannelParallel",
    "ContextParallel",
    "DataParallel",
    "IGNORE_INDEX",
    "Layout",
    "ModelConverter",
    "Muon",
    "MoETensorParallel",
    "SharedInputParallel",
    "ShardParameters",
    "OVERLAP_MODES",
    "ParallelDims",
    "ParallelModel",
    "Pipeline",
    "PipelinePlan",
    "RingAttention",
    "SCHEDULES",
    "ZERO_BUBBLE",
    "SIMPLE_FSDP_MODES",
    "SimpleFSDPOptions",
    "apply_ac",
    "apply_compile",
    "apply_cp",
    "apply_ddp",
    "apply_fsdp",
    "apply_simple_fsdp",
    "apply_tp",
    "auto_loss_chunk_tokens",
    "build_parallel_model",
    "build_pipeline",
    "check_ac_options",
    "check_loss_chunking",
    "check_tp_degree",
    "compiled_block_ac_refusal",
    "describe_applied",
    "clip_grad_norm_",
    "device_module",
    "device_type",
    "distributed_backend",
    "enable_overlap",
    "format_applied",
    "load_balanced_positions",
    "loss_context",
    "option_names",
    "plan_pipeline",
    "ring_attention",
    "shard_sequence",
    "sharded_params",
    "unshard_sequence",
]
