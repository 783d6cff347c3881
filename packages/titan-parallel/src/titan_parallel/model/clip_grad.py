"""Gradient-norm clipping that is correct when gradients are DTensors sharded over any mesh."""

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


@torch.no_grad()
def clip_grad_norm_(
    parameters, max_norm: float, norm_type: float = 2.0, pp_group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """Clip in place to `max_norm` (math.inf: measure only); returns the total norm over all ranks.

    A DTensor norm is a partial result on its mesh, so it is reduced (`full_tensor`) before use; pipeline
    stages hold disjoint parameters, so their norms are combined over `pp_group`.
    """
    parameters = list(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, norm_type, foreach=True)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if pp_group is not None:
        if norm_type == float("inf"):
            dist.all_reduce(total, op=dist.ReduceOp.MAX, group=pp_group)
        else:
            total = total**norm_type
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=pp_group)
            total = total ** (1.0 / norm_type)
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total, foreach=True)
    return total
