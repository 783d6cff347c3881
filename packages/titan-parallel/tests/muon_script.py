"""Muon on DTensor parameters under torchrun (gloo, 2 ranks):

    torchrun --nproc_per_node 2 muon_script.py [per_shard]

Reference: the same optimizer on plain tensors holding the whole parameters and gradients, in this process.
Each placement (FSDP rows, TP columns or rows, HSDP, uneven shards, expert stacks split by expert or by rows)
must give the reference's parameters after 3 steps bit for bit (rtol 0): the gathered update is the whole
update's bits, and every rank runs the same operations on it. Expert stacks split by expert are orthogonalized
where they are, batched over fewer experts: rtol 1e-6. `per_shard` breaks the rule on purpose (each shard
orthogonalized alone), to see these cases fail.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from multiprocess import run_cases  # noqa: E402

from titan_parallel.optim import whole_matrix  # noqa: E402
from titan_parallel.optim.muon import Muon, adjusted_lr  # noqa: E402

STEPS = 3


def whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def grads(shape, step: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(1000 + step))


def matches_reference(shape, mesh, placements, rtol: float, muon: bool = True) -> None:
    start = torch.randn(shape, generator=torch.Generator().manual_seed(7))
    sharded = torch.nn.Parameter(distribute_tensor(start, mesh, placements))
    plain = torch.nn.Parameter(start.clone())
    group = {} if muon else {"use_muon": False, "lr": 1e-2}
    optimizers = [Muon([{"params": [p], **group}], lr=0.02, foreach=True) for p in (sharded, plain)]
    for step in range(STEPS):
        plain.grad = grads(shape, step)
        sharded.grad = distribute_tensor(plain.grad, mesh, placements)
        for optimizer in optimizers:
            optimizer.step()
    torch.testing.assert_close(whole(sharded), plain, rtol=rtol, atol=rtol * 1e-2)
    state = optimizers[0].state[sharded]["momentum_buffer" if muon else "exp_avg"]
    assert isinstance(state, DTensor) and state.placements == sharded.placements  # checkpoints reshard it


def orthogonalized_whole(mesh) -> None:
    """Applied: one step from rest without weight decay moves a row-sharded square matrix by lr' times its
    update; gathered, that update has the singular values of an orthogonalized whole (about [0.7, 1.2]). Each
    half orthogonalized alone would leave directions near 0: the halves' row spaces overlap."""
    shape = (32, 32)
    sharded = torch.nn.Parameter(distribute_tensor(torch.zeros(shape), mesh, [Shard(0)]))
    sharded.grad = distribute_tensor(grads(shape, 0), mesh, [Shard(0)])
    Muon([sharded], lr=0.1, weight_decay=0.0, ns_dtype=torch.float32).step()
    singular = torch.linalg.svdvals(-whole(sharded) / adjusted_lr(0.1, None, shape))
    assert singular.min() > 0.5 and singular.max() < 1.5, f"not orthogonalized whole: {singular}"


def orthogonalize_each_shard_alone() -> None:
    """The wrong distribution: what a naive port does (each rank's shard as if it were the matrix)."""

    def per_shard(update, orthogonalize):
        if not isinstance(update, DTensor):
            return orthogonalize(update)
        local = orthogonalize(update.to_local())
        return DTensor.from_local(local, update.device_mesh, update.placements, shape=update.shape,
                                  stride=update.stride())  # fmt: skip

    sys.modules["titan_parallel.optim.muon"].orthogonalize_whole = per_shard
    whole_matrix.orthogonalize_whole = per_shard


def cases() -> dict:
    if sys.argv[1:] == ["per_shard"]:
        orthogonalize_each_shard_alone()
    mesh = init_device_mesh("cpu", (2,))
    hsdp = init_device_mesh("cpu", (1, 2), mesh_dim_names=("replicate", "shard"))
    exact = 0.0
    return {
        "fsdp_rows": lambda: matches_reference((24, 8), mesh, [Shard(0)], exact),
        "fsdp_uneven_rows": lambda: matches_reference((7, 5), mesh, [Shard(0)], exact),
        "tp_colwise": lambda: matches_reference((16, 12), mesh, [Shard(0)], exact),
        "tp_rowwise": lambda: matches_reference((12, 16), mesh, [Shard(1)], exact),
        "replicated": lambda: matches_reference((12, 16), mesh, [Replicate()], exact),
        "hsdp": lambda: matches_reference((10, 6), hsdp, [Replicate(), Shard(0)], exact),
        "experts_by_expert": lambda: matches_reference((4, 6, 10), mesh, [Shard(0)], 1e-6),
        "experts_by_rows": lambda: matches_reference((4, 6, 10), mesh, [Shard(1)], exact),
        "adamw_sharded": lambda: matches_reference((7,), mesh, [Shard(0)], exact, muon=False),
        "orthogonalized_whole": lambda: orthogonalized_whole(mesh),
    }


if __name__ == "__main__":
    run_cases(cases, deterministic=True)
    assert not dist.is_initialized()
