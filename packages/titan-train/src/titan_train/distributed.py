"""Process-group setup from torchrun's environment (or none, for a plain single-process run)."""

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from titan_parallel import device_module, device_type, distributed_backend


@dataclass
class RunEnv:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(init_timeout_seconds: int = 300) -> RunEnv:
    """Join torchrun's process group when launched by it; pick this rank's device."""
    kind = device_type()
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = world_size_from_env()
    if kind == "cpu":
        device = torch.device("cpu")
    else:
        device = torch.device(kind, local_rank)
        device_module(kind).set_device(device)
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group(
            backend=distributed_backend(kind),
            timeout=datetime.timedelta(seconds=init_timeout_seconds),
            device_id=device if kind != "cpu" else None,
        )
    return RunEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
