"""Hyena checks that need real ranks: 2 CPU processes on gloo. Run by test_two_ranks.py as a script.
(Tensor parallelism needs titan-parallel: its checks are titan-train's tests/hyena_tp_checks.py.)

    python two_rank_checks.py PORT CHECK [CHECK ...]

Prints "rank R CHECK ok" or "rank R CHECK failed" and a traceback, for every rank and check.
"""

import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from titan_models.hyena import FLAVORS, HyenaLM

WORLD_SIZE = 2


def build(seed: int, on_meta: bool = False) -> HyenaLM:
    with torch.device("meta"):
        model = HyenaLM(FLAVORS["tiny"])
    if not on_meta:
        model.to_empty(device="cpu")
        model.init_weights(seed=seed)
    return model


def sharded_init(mesh) -> None:
    """Every parameter sharded on dim 0 (as FSDP does), then init_weights: same weights as one device."""
    model = build(0, on_meta=True)
    model.to_empty(device="cpu")
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            sharded = distribute_tensor(param.detach(), mesh, [Shard(0)], src_data_rank=None)
            module.register_parameter(name, nn.Parameter(sharded))
    model.init_weights(seed=0)
    expected = build(seed=0).state_dict()
    for name, param in model.state_dict().items():
        assert torch.equal(param.full_tensor(), expected[name]), name


def run(rank: int, port: int, checks: list[str]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        mesh = init_device_mesh("cpu", (WORLD_SIZE,))
        for check in checks:
            try:
                globals()[check](mesh)
                print(f"rank {rank} {check} ok", flush=True)
            except Exception:
                print(f"rank {rank} {check} failed\n{traceback.format_exc()}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    # fork: the children inherit the imported torch instead of importing it again (seconds on a busy CPU).
    mp.start_processes(run, args=(int(sys.argv[1]), sys.argv[2:]), nprocs=WORLD_SIZE, start_method="fork")
