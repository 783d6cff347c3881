"""Parallelism for Titan, applied to any module from its plan data.

Here now: the device helper (`device_type`, `device_module`, `distributed_backend`) and `ParallelDims`.
Coming with the titan-parallel issues: the named device mesh, FSDP2/HSDP/DDP,
SimpleFSDP, tensor/sequence/loss parallel, pipeline and context parallel, activation checkpointing
and regional compile.
"""

from titan_parallel.device import device_module, device_type, distributed_backend
from titan_parallel.parallel_dims import ParallelDims

__version__ = "0.1.0"

__all__ = ["ParallelDims", "device_module", "device_type", "distributed_backend"]
