"""Hyena checks that need real ranks: 2 CPU processes on gloo. Run by test_two_ranks.py as a script.

    python two_rank_checks.py PORT CHECK [CHECK ...]

Prints "rank R CHECK ok" or "rank R CHECK failed" and a traceback, for every rank and check.
"""

import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import loss_parallel, parallelize_module

from titan_models.hyena import FLAVORS, HyenaLM, hyena_tp_plan

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


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {
        name: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad for name, p in model.named_parameters()
    }


def tensor_parallel(mesh) -> None:
    """hyena_tp_plan on 2 ranks, applied on meta then initialized as the trainer does: the single-device
    logits, loss and every gradient (the replicated filter MLP's partial gradients summed)."""
    tokens = torch.randint(0, 2048, (2, 16), generator=torch.Generator().manual_seed(0))
    labels = tokens.roll(-1, dims=1)
    reference = build(seed=0)
    expected_logits = reference(tokens)
    F.cross_entropy(expected_logits.flatten(0, 1), labels.flatten()).backward()
    expected_grads = _grads(reference)
    for use_loss_parallel in (False, True):
        model = build(0, on_meta=True)
        parallelize_module(model, mesh, hyena_tp_plan(loss_parallel=use_loss_parallel))
        model.to_empty(device="cpu")
        model.init_weights(seed=0)
        mixer = model.layers["0"].mixer
        assert mixer.short_filter.weight.placements == (Shard(0),)
        assert mixer.filter.decay_rates.to_local().shape == (model.args.dim // WORLD_SIZE,)
        logits = model(tokens)
        with loss_parallel() if use_loss_parallel else torch.enable_grad():
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
            loss.backward()
        full_logits = logits.full_tensor() if isinstance(logits, DTensor) else logits
        torch.testing.assert_close(full_logits, expected_logits, atol=1e-5, rtol=1e-5)
        grads = _grads(model)
        assert grads.keys() == expected_grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, expected_grads[name], atol=1e-6, rtol=1e-4, msg=name)


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
