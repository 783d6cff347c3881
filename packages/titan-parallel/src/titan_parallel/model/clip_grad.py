"""Gradient-norm clipping that is correct when gradients are DTensors sharded over any mesh."""

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


@torch.no_grad()
def clip_grad_norm_(
    parameters,
    max_norm: float,
    norm_type: float = 2.0,
    pp_group: dist.ProcessGroup | None = None,
    uncounted: set[int] = frozenset(),
) -> torch.Tensor:
    """Clip in place to `max_norm` (math.inf: measure only); returns the total norm over all ranks.

    A DTensor norm is a partial result on its mesh, so it is reduced (`full_tensor`) before use; gradients on
    different meshes (expert parallel's experts beside the dense parameters) are normed per mesh and the norms
    combined; pipeline stages hold disjoint parameters, so their norms are combined over `pp_group`, but for
    copies another stage holds too (a shared embedding): their ids in `uncounted` are clipped, not counted.
    """
    parameters = list(parameters)
    by_mesh: dict[object, list[torch.Tensor]] = {}  # parameters with a gradient, by the gradient's mesh
    for p in parameters:
        if p.grad is not None:
            by_mesh.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p)
    norms = []
    for params in by_mesh.values():
        counted = [p.grad for p in params if id(p) not in uncounted]
        if counted:
            norm = torch.nn.utils.get_total_norm(counted, norm_type, foreach=True)
            norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total = norms[0] if len(norms) == 1 else torch.nn.utils.get_total_norm(norms, norm_type)
    if pp_group is not None:
        if norm_type == float("inf"):
            dist.all_reduce(total, op=dist.ReduceOp.MAX, group=pp_group)
        else:
            total = total**norm_type
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=pp_group)
            total = total ** (1.0 / norm_type)
    for params in by_mesh.values():  # a foreach op takes tensors of one mesh
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    return total
