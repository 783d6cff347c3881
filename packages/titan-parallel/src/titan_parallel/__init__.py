"""Parallelism for Titan, applied to any module from its plan data (it knows nothing of any model).

- `device_type`, `device_module`, `distributed_backend`: the one place that picks the device and backend.
- `ParallelDims`: the degrees (dp_replicate x dp_shard x cp x tp x pp = world size) and the named mesh.
- `apply_tp` (+ `check_tp_degree`, `loss_context`): tensor + sequence parallel, loss parallel.
- `apply_ac`: activation checkpointing of the repeated blocks (full, every Nth, per op).
- `apply_compile`: regional torch.compile of the repeated blocks.
- `apply_fsdp` / `apply_ddp`: FSDP2 (HSDP on a 2-D mesh) or DDP.
- `apply_simple_fsdp` (`SIMPLE_FSDP_MODES`, `sharded_params`): SimpleFSDP, the compiler-friendly FSDP/DDP/HSDP
  from DTensor parametrizations; `enable_overlap` (`OVERLAP_MODES`): inductor's bucketing/reordering for it.
- `clip_grad_norm_`: gradient clipping across every mesh.
- Pipeline parallel: `split_blocks` + `build_stage_modules` (stages from the plan's blocks), the checks
  `resolve_num_stages` / `check_microbatches` / `check_schedule_support`, `schedule_name`,
  `stage_ids_for_rank`, `build_pipeline` -> `Pipeline.step`.
- Context parallel: `shard_sequence` / `unshard_sequence` / `load_balanced_positions` (the causal
  load-balanced split), `ring_attention`, and `context_parallel_attention` (routes SDPA to it).
"""

from titan_parallel.activation_checkpoint import apply_ac
from titan_parallel.clip_grad import clip_grad_norm_
from titan_parallel.compile import apply_compile
from titan_parallel.context_parallel import (
    context_parallel_attention,
    load_balanced_positions,
    shard_sequence,
    unshard_sequence,
)
from titan_parallel.data_parallel import apply_ddp, apply_fsdp
from titan_parallel.device import device_module, device_type, distributed_backend
from titan_parallel.parallel_dims import ParallelDims
from titan_parallel.pipeline import (
    SCHEDULES,
    Pipeline,
    build_pipeline,
    check_microbatches,
    check_schedule_support,
    resolve_num_stages,
    schedule_class,
    schedule_name,
    stage_ids_for_rank,
)
from titan_parallel.pipeline_split import build_stage_modules, split_blocks
from titan_parallel.ring_attention import ring_attention
from titan_parallel.simple_fsdp import MODES as SIMPLE_FSDP_MODES
from titan_parallel.simple_fsdp import apply_simple_fsdp, sharded_params
from titan_parallel.simple_fsdp_overlap import OVERLAP_MODES, enable_overlap
from titan_parallel.tensor_parallel import apply_tp, check_tp_degree, loss_context

__version__ = "0.1.0"

__all__ = [
    "OVERLAP_MODES",
    "ParallelDims",
    "Pipeline",
    "SCHEDULES",
    "SIMPLE_FSDP_MODES",
    "apply_ac",
    "apply_compile",
    "apply_ddp",
    "apply_fsdp",
    "apply_simple_fsdp",
    "apply_tp",
    "build_pipeline",
    "build_stage_modules",
    "check_microbatches",
    "check_schedule_support",
    "check_tp_degree",
    "clip_grad_norm_",
    "context_parallel_attention",
    "device_module",
    "device_type",
    "distributed_backend",
    "enable_overlap",
    "load_balanced_positions",
    "loss_context",
    "resolve_num_stages",
    "ring_attention",
    "schedule_class",
    "schedule_name",
    "shard_sequence",
    "sharded_params",
    "split_blocks",
    "stage_ids_for_rank",
    "unshard_sequence",
]
