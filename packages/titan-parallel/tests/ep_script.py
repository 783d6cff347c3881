"""Expert parallelism under torchrun (gloo), every rank one expert-parallel rank:

    torchrun --nproc_per_node N ep_script.py

Reference: the same routed rows through every expert on one rank (float32, the same weights everywhere).
Outputs and row gradients rtol 1e-5 / atol 1e-6; the weight gradients of a rank's experts equal the sum over
ranks of the reference's (each rank's rows reach their expert wherever it is).
"""

import functools
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from multiprocess import run_cases  # noqa: E402

from titan_parallel.ep.expert_parallel import apply_ep  # noqa: E402
from titan_parallel.ep.token_dispatch import combine, dispatch  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-6)
DIM = 8


class LoopExperts(nn.Module):
    """Routed experts as a model declares them (titan-parallel's tests hold no model package): weights stacked
    per expert on dim 0, forward(rows sorted by expert, offsets) -> one row per row."""

    def __init__(self, experts: int):
        super().__init__()
        self.w_in = nn.Parameter(torch.empty(experts, DIM, 2 * DIM))
        self.w_out = nn.Parameter(torch.empty(experts, 2 * DIM, DIM))

    def forward(self, rows: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        w_in, w_out = (w.to_local() if isinstance(w, DTensor) else w for w in (self.w_in, self.w_out))
        ends = offsets.tolist()
        outs = [
            torch.tanh(rows[start:end] @ w_in[e]) @ w_out[e]
            for e, (start, end) in enumerate(zip([0, *ends[:-1]], ends, strict=True))
        ]
        return torch.cat(outs) if outs else rows.new_zeros(0, DIM)


def routed_rows(rank: int, experts: int, pattern: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows [n, DIM] sorted by expert, counts [experts]) of this rank. pattern "random": random counts with
    some experts empty; "silent": rank 0 sends nothing; "one_expert": every row to expert 1."""
    generator = torch.Generator().manual_seed(100 + rank)
    if pattern == "silent" and rank == 0:
        counts = torch.zeros(experts, dtype=torch.int64)
    elif pattern == "one_expert":
        counts = torch.zeros(experts, dtype=torch.int64)
        counts[1] = 5 + rank
    else:
        counts = torch.randint(0, 4, (experts,), generator=generator)
        counts[rank % experts] = 0  # an expert this rank sends nothing to
    rows = torch.randn(int(counts.sum()), DIM, generator=generator)
    return rows, counts


def reference_experts(experts: int) -> LoopExperts:
    torch.manual_seed(0)
    module = LoopExperts(experts)
    for weight in module.parameters():
        nn.init.normal_(weight, std=0.3)
    return module


def case_dispatch(ep: int, pattern: str) -> None:
    """dispatch -> local experts -> combine equals the unsharded experts on this rank's rows, with gradients."""
    rank, experts = dist.get_rank(), 2 * ep
    group = dist.group.WORLD
    rows, counts = routed_rows(rank, experts, pattern)
    grad_out = torch.randn(rows.shape[0], DIM, generator=torch.Generator().manual_seed(7 + rank))
    full = reference_experts(experts)
    reference_rows = rows.clone().requires_grad_()
    reference = full(reference_rows, counts.cumsum(0).to(torch.int32))
    reference.backward(grad_out)

    local = LoopExperts(2)
    with torch.no_grad():
        for name, weight in local.named_parameters():
            weight.copy_(getattr(full, name)[2 * rank : 2 * rank + 2])
    ep_rows = rows.clone().requires_grad_()
    local_rows, offsets, dispatched = dispatch(ep_rows, counts, group)
    assert offsets.numel() == 2 and int(offsets[-1]) == local_rows.shape[0]
    out = combine(local(local_rows, offsets), dispatched, group)
    out.backward(grad_out)
    torch.testing.assert_close(out, reference, **TOL)
    torch.testing.assert_close(ep_rows.grad, reference_rows.grad, **TOL)
    for name, weight in local.named_parameters():
        summed = getattr(full, name).grad.clone()
        dist.all_reduce(summed)
        torch.testing.assert_close(weight.grad, summed[2 * rank : 2 * rank + 2], **TOL)


def case_apply_ep(ep: int) -> None:
    """apply_ep on a module: parameters become dim-0 shards over the mesh, the hooks route the rows."""
    rank, experts = dist.get_rank(), 2 * ep
    mesh = init_device_mesh("cpu", (ep,), mesh_dim_names=("ep",))
    full = reference_experts(experts)
    sharded = reference_experts(experts)
    holder = nn.Module()
    holder.experts = sharded
    assert apply_ep(holder, mesh, ["experts"]) == [sharded]
    assert tuple(sharded.w_in.shape) == (experts, DIM, 2 * DIM) and sharded.w_in.to_local().shape[0] == 2
    rows, counts = routed_rows(rank, experts, "random")
    offsets = counts.cumsum(0).to(torch.int32)
    torch.testing.assert_close(holder.experts(rows, offsets), full(rows, offsets), **TOL)
    with torch.no_grad():
        torch.testing.assert_close(sharded.w_out.to_local(), full.w_out[2 * rank : 2 * rank + 2])


def build_cases() -> dict:
    ep = dist.get_world_size()
    cases = {f"dispatch_{p}": functools.partial(case_dispatch, ep, p) for p in ("random", "silent", "one_expert")}
    cases["apply_ep"] = functools.partial(case_apply_ep, ep)
    return cases


if __name__ == "__main__":
    run_cases(build_cases)
