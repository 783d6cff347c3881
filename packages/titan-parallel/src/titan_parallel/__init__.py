"""Parallelism for Titan, applied to any module from its plan data (it knows nothing of any model).

- `device_type`, `device_module`, `distributed_backend`: the one place that picks the device and backend.
- `ParallelDims`: the degrees (dp_replicate x dp_shard x cp x tp x pp = world size) and the named mesh.
- `apply_tp` (+ `check_tp_degree`, `loss_context`): tensor + sequence parallel, loss parallel.
- `apply_ac`: activation checkpointing of the repeated blocks (full, every Nth, per op).
- `apply_compile`: regional torch.compile of the repeated blocks.
- `apply_fsdp` / `apply_ddp`: FSDP2 (HSDP on a 2-D mesh) or DDP.
- `clip_grad_norm_`: gradient clipping across every mesh.
Coming with their issues: SimpleFSDP, pipeline and context parallel.
"""

from titan_parallel.activation_checkpoint import apply_ac
from titan_parallel.clip_grad import clip_grad_norm_
from titan_parallel.compile import apply_compile
from titan_parallel.data_parallel import apply_ddp, apply_fsdp
from titan_parallel.device import device_module, device_type, distributed_backend
from titan_parallel.parallel_dims import ParallelDims
from titan_parallel.tensor_parallel import apply_tp, check_tp_degree, loss_context

__version__ = "0.1.0"

__all__ = [
    "ParallelDims",
    "apply_ac",
    "apply_compile",
    "apply_ddp",
    "apply_fsdp",
    "apply_tp",
    "check_tp_degree",
    "clip_grad_norm_",
    "device_module",
    "device_type",
    "distributed_backend",
    "loss_context",
]
