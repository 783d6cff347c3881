"""Process-group setup from torchrun's environment (or none, for a plain single-process run)."""

import datetime
import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from titan_debug import flight_recorder_env
from titan_parallel import device_module, device_type, distributed_backend
from titan_train.config import JobConfig
from titan_train.run.rendezvous import torchrun_store


@dataclass
class RunEnv:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    modelled_device_type: str | None = None
    """The device type a dry run models where it differs from `device`'s ("cuda" on a CPU): choices made by
    backend (float8 TP collectives) follow it, as async TP's do."""


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(config: JobConfig | None = None) -> RunEnv:
    """Join torchrun's process group when launched by it; pick this rank's device.

    The flight recorder is configured first (torch reads its settings when the group is created), and the
    group starts with the generous init timeout; the trainer shortens it once the first step is done.
    """
    init_timeout_seconds = config.comm.init_timeout_seconds if config else 300
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
        if config is not None:
            os.environ.update(flight_recorder_env(config.comm.trace_buf_size, config.job.dump_folder))
        dist.init_process_group(
            backend=distributed_backend(kind),
            timeout=datetime.timedelta(seconds=init_timeout_seconds),
            device_id=device if kind != "cpu" else None,
            **_store_kwargs(rank, world_size, init_timeout_seconds),
        )
    return RunEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def _store_kwargs(rank: int, world_size: int, timeout_seconds: float) -> dict:
    """A store of this group's own when torchrun shares one store with every restart (see rendezvous.py);
    otherwise torch's env:// rendezvous, whose store lives and dies with this group's rank 0."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return {}
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    store = torchrun_store(addr, port, rank, world_size, timeout_seconds)
    return {"store": store, "rank": rank, "world_size": world_size}


def shutdown_distributed() -> None:
    if dist.is_initialized():
        # Free unreferenced collective work objects (and the tensors they hold) while the interpreter is whole:
        # gloo threads releasing them during interpreter teardown can abort the process (SIGABRT, "terminate
        # called without an active exception"; pytorch/pytorch#179291).
        gc.collect()
        dist.destroy_process_group()
