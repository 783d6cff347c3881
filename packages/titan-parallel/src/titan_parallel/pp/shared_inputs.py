"""Input modules that the first and the last pipeline stage both hold (ModelPlan.shared_input_fqns): the token
embedding, which the multi-token prediction modules (embedding shifted tokens) and a tied output projection read
on the last stage.

Each stage holds a copy, drawn alike from (seed, name). A copy's gradient is the part of the whole gradient its
stage's forward contributed, so once per step, after the last micro-batch's backward and before the gradient
norm and the update, the two are summed and both copies get the sum: they stay equal under any optimizer, as one
parameter would. The gradient norm counts the first stage's copy only; a checkpoint keeps one key (DCP writes
equal entries once, and both copies load it).

Cost: per step, one point-to-point exchange of the copy's gradient as this rank holds it (its FSDP / TP shard),
between the pipeline ranks of the first and the last stage: 4 x vocab x dim / (FSDP x TP) bytes each way in
float32, none when one rank holds both (V schedules). Nothing moves per micro-batch. The alternative, the first
stage's embeddings of the shifted tokens carried through every stage, would move D x micro-batch x seq x dim
activations per micro-batch across every stage boundary, both ways. Megatron-LM makes the same choice for tied
embeddings and MTP.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor


class SharedInputs:
    """The copies of the shared input modules this rank holds, and the exchange that keeps them equal."""

    def __init__(
        self,
        parts: list[nn.Module],
        stage_ids: list[int] | tuple[int, ...],
        num_stages: int,
        fqns: list[str],
        group: dist.ProcessGroup,
        last_stage_rank: int,
    ):
        """parts: this rank's stage modules, stage_ids their stages; group: the pipeline group, in which stage 0
        lives on rank 0 and the last stage on `last_stage_rank`."""
        self.first = _trained_copies(parts, stage_ids, 0, fqns)
        self.last = _trained_copies(parts, stage_ids, num_stages - 1, fqns)
        self.group = group
        self.peer = last_stage_rank if self.first else 0

    @property
    def uncounted(self) -> set[int]:
        """ids of the last stage's copies: the gradient norm counts each shared parameter once, as the first's."""
        return {id(param) for param in self.last}

    @torch.no_grad()
    def sum_gradients(self) -> None:
        """Both copies' gradients become their sum. A collective of the first and the last stage's pipeline ranks:
        both call it once per step, after the step's backward passes."""
        if self.first and self.last:  # one rank holds both stages
            for a, b in zip(self.first, self.last, strict=True):
                total = _local_grad(a) + _local_grad(b)
                _local_grad(a).copy_(total)
                _local_grad(b).copy_(total)
            return
        mine = [_local_grad(param) for param in self.first or self.last]
        if not mine:
            return
        theirs = [torch.empty_like(grad) for grad in mine]
        ops = [dist.P2POp(dist.isend, grad, group=self.group, group_peer=self.peer) for grad in mine]
        ops += [dist.P2POp(dist.irecv, buffer, group=self.group, group_peer=self.peer) for buffer in theirs]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        for grad, other in zip(mine, theirs, strict=True):
            # first + last on both ranks, in that order: the two sums are equal to the bit.
            total = grad + other if self.first else other + grad
            grad.copy_(total)


def _trained_copies(parts: list[nn.Module], stage_ids, stage: int, fqns: list[str]) -> list[nn.Parameter]:
    """The trained parameters of the shared modules in this rank's part for `stage` (none if it holds no such
    part), in name order: the same order on both ranks."""
    for part, stage_id in zip(parts, stage_ids, strict=True):
        if stage_id == stage:
            named = [
                (f"{fqn}.{name}", param)
                for fqn in fqns
                for name, param in part.get_submodule(fqn).named_parameters()
                if param.requires_grad  # frozen (a LoRA base): no gradient on either side
            ]
            return [param for _, param in sorted(named, key=lambda item: item[0])]
    return []


def _local_grad(param: nn.Parameter) -> torch.Tensor:
    """The gradient as this rank stores it (a DTensor's local shard), made zeros where backward left none."""
    if param.grad is None:
        param.grad = torch.zeros_like(param)
    grad = param.grad
    return grad.to_local() if isinstance(grad, DTensor) else grad
