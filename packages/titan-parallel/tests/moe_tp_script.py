"""Tensor parallelism of a mixture-of-experts layer under torchrun (gloo), every rank one TP rank:

    torchrun --nproc_per_node N moe_tp_script.py

A toy layer with the shape MoETensorParallel expects (titan-parallel's tests hold no model package): a router
returning weights, experts w1 / w2 / w3 stacked per expert, a per-token auxiliary term on the scores (the
gradient that is whole on every rank). Reference: the same layer, weights and whole sequence on one rank.
Output, input gradient and every weight gradient (this rank's slice) rtol 1e-5 / atol 1e-6.

Beside expert parallelism (`with_expert_parallel`): the experts take rows sorted by expert and their offsets
(apply_ep's contract), split by expert over the tp ranks, each of which dispatches its share of the rows.
"""

import dataclasses
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from multiprocess import run_cases  # noqa: E402

from titan_parallel import apply_tp  # noqa: E402
from titan_parallel.ep.expert_parallel import apply_ep  # noqa: E402
from titan_parallel.tp.moe_parallel import MoETensorParallel  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-6)
DIM, HIDDEN, EXPERTS, TOP_K = 8, 12, 4, 2


def local(weight: torch.Tensor) -> torch.Tensor:
    return weight.to_local() if isinstance(weight, DTensor) else weight


@dataclasses.dataclass
class Routing:
    experts: torch.Tensor
    weights: torch.Tensor
    scores: torch.Tensor


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(EXPERTS, DIM) * 0.5)


class Router(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = Gate()

    def forward(self, tokens: torch.Tensor) -> Routing:
        scores = F.linear(tokens, local(self.gate.weight)).softmax(-1)
        experts = scores.topk(TOP_K, dim=-1).indices
        return Routing(experts, scores.gather(-1, experts), scores)


class Experts(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(EXPERTS, DIM, HIDDEN) * 0.3)
        self.w3 = nn.Parameter(torch.randn(EXPERTS, DIM, HIDDEN) * 0.3)
        self.w2 = nn.Parameter(torch.randn(EXPERTS, HIDDEN, DIM) * 0.3)

    def forward(self, rows: torch.Tensor, expert_of_row: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = (local(w) for w in (self.w1, self.w2, self.w3))
        hidden = F.silu(torch.einsum("rd,rdh->rh", rows, w1[expert_of_row]))
        hidden = hidden * torch.einsum("rd,rdh->rh", rows, w3[expert_of_row])
        return torch.einsum("rh,rhd->rd", hidden, w2[expert_of_row])


class SharedExperts(nn.Module):
    """Every token's SwiGLU, computed from its weights' local parts (as titan_models' SharedExperts)."""

    def __init__(self):
        super().__init__()
        self.w1, self.w3 = nn.Linear(DIM, HIDDEN, bias=False), nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = (local(linear.weight) for linear in (self.w1, self.w2, self.w3))
        return F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2)


class ToyMoE(nn.Module):
    def __init__(self, shared: bool = False):
        super().__init__()
        self.router, self.experts = Router(), Experts()
        self.shared_experts = SharedExperts() if shared else None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        bs, seqlen, dim = x.shape
        tokens = x.reshape(-1, dim)
        routing = self.router(tokens)
        token_of = torch.arange(tokens.shape[0]).repeat_interleave(TOP_K)
        out = self.experts(tokens[token_of], routing.experts.reshape(-1)) * routing.weights.reshape(-1, 1)
        out = torch.zeros_like(tokens).index_add_(0, token_of, out)
        if self.shared_experts is not None:
            out = out + self.shared_experts(tokens)
        aux = (routing.scores**2).sum()  # whole on every rank, like the auxiliary losses
        return out.reshape(bs, seqlen, dim), aux


class SortedExperts(Experts):
    """The experts as expert parallelism wants them: rows sorted by expert, offsets[e] the end of e's rows."""

    def forward(self, rows: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        expert_of_row = torch.repeat_interleave(torch.diff(offsets.long(), prepend=offsets.new_zeros(1).long()))
        return super().forward(rows, expert_of_row)


class SortedToyMoE(ToyMoE):
    def __init__(self, shared: bool = False):
        super().__init__(shared)
        self.experts = SortedExperts()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        bs, seqlen, dim = x.shape
        tokens = x.reshape(-1, dim)
        routing = self.router(tokens)
        order = routing.experts.reshape(-1).argsort(stable=True)
        token_of = order // TOP_K
        offsets = torch.bincount(routing.experts.reshape(-1), minlength=EXPERTS).cumsum(0)
        out = self.experts(tokens[token_of], offsets) * routing.weights.reshape(-1, 1)[order]
        out = torch.zeros_like(tokens).index_add_(0, token_of, out)
        if self.shared_experts is not None:
            out = out + self.shared_experts(tokens)
        return out.reshape(bs, seqlen, dim), (routing.scores**2).sum()


def case_matches_one_rank() -> None:
    _check_against_one_rank(expert_parallel=False)


def case_with_expert_parallel() -> None:
    _check_against_one_rank(expert_parallel=True)


def case_with_shared_experts() -> None:
    _check_against_one_rank(expert_parallel=False, shared=True)


def case_with_shared_experts_and_expert_parallel() -> None:
    _check_against_one_rank(expert_parallel=True, shared=True)


def _check_against_one_rank(expert_parallel: bool, shared: bool = False) -> None:
    rank, tp = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    layer = SortedToyMoE if expert_parallel else ToyMoE
    reference = layer(shared)
    sharded = layer(shared)
    sharded.load_state_dict(reference.state_dict())
    apply_tp(sharded, mesh, {"": MoETensorParallel(expert_parallel=expert_parallel)})
    if expert_parallel:
        apply_ep(sharded, mesh, ["experts"], tp_mesh=mesh)
    x = torch.randn(2, 4 * tp, DIM, generator=torch.Generator().manual_seed(1), requires_grad=True)
    grad_out = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))

    out, aux = reference(x)
    (out * grad_out).sum().add(aux).backward()

    mine = x.detach().chunk(tp, dim=1)[rank].requires_grad_()
    out_part, aux_part = sharded(DTensor.from_local(mine, mesh, (Shard(1),)))
    (out_part * grad_out.chunk(tp, dim=1)[rank]).sum().add(aux_part).backward()

    torch.testing.assert_close(out_part, out.chunk(tp, dim=1)[rank], **TOL)
    torch.testing.assert_close(mine.grad, x.grad.chunk(tp, dim=1)[rank], **TOL)
    torch.testing.assert_close(local(sharded.router.gate.weight.grad), reference.router.gate.weight.grad, **TOL)
    for name, dim in (("w1", 2), ("w3", 2), ("w2", 1)):
        want = getattr(reference.experts, name).grad.chunk(tp, dim=0 if expert_parallel else dim)[rank]
        torch.testing.assert_close(local(getattr(sharded.experts, name).grad), want, **TOL, msg=name)
    for name, dim in (("w1", 0), ("w3", 0), ("w2", 1)) if shared else ():
        want = getattr(reference.shared_experts, name).weight.grad.chunk(tp, dim=dim)[rank]
        got = local(getattr(sharded.shared_experts, name).weight.grad)
        torch.testing.assert_close(got, want, **TOL, msg=f"shared {name}")


if __name__ == "__main__":
    run_cases(
        lambda: {
            "matches_one_rank": case_matches_one_rank,
            "with_expert_parallel": case_with_expert_parallel,
            "with_shared_experts": case_with_shared_experts,
            "with_shared_experts_and_expert_parallel": case_with_shared_experts_and_expert_parallel,
        }
    )
