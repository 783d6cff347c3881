"""How SimpleFSDP gathers one parameter: its GatherSpec and `gather`. The parametrization (simple_fsdp.py)
gathers in forward; backward gathers again where the result was not kept (simple_fsdp_recompute.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor.placement_types import Placement


@dataclass(frozen=True)
class GatherSpec:
    """How one parameter is stored and gathered; equal for every parameter of the same kind."""

    dp_mesh: DeviceMesh
    dp_placements: tuple[Placement, ...]  # (Shard(0),), (Replicate(),) or (Replicate(), Shard(0))
    param_dtype: torch.dtype
    reduce_dtype: torch.dtype
    recompute: bool
    # Set when tensor parallelism sharded the parameter first: its mesh, placements, and this rank's shard's
    # shape and strides before data-parallel sharding.
    tp_mesh: DeviceMesh | None = None
    tp_placements: tuple[Placement, ...] | None = None
    tp_local_shape: torch.Size | None = None
    tp_local_stride: tuple[int, ...] | None = None


def gather(param: DTensor, spec: GatherSpec) -> torch.Tensor:
    """All-gather over the dp mesh in param_dtype; in backward, average the gradient in reduce_dtype.

    Returns the local full tensor, or with tensor parallelism a DTensor on the tp mesh, as TP layers expect.
    """
    replicate = (Replicate(),) * spec.dp_mesh.ndim
    average = (Partial("avg"),) * spec.dp_mesh.ndim
    dtypes = {"forward_dtype": spec.param_dtype, "backward_dtype": spec.reduce_dtype}
    if spec.tp_mesh is None:
        return param.redistribute(placements=replicate, **dtypes).to_local(grad_placements=average)
    # View the local shard as a DTensor on the dp mesh alone (its "full" shape is this rank's TP shard),
    # gather it there, and rewrap the result on the tp mesh.
    shape, stride = spec.tp_local_shape, spec.tp_local_stride
    dp_view = DTensor.from_local(param.to_local(), spec.dp_mesh, spec.dp_placements, shape=shape, stride=stride)
    local = dp_view.redistribute(placements=replicate, **dtypes).to_local(grad_placements=average)
    return DTensor.from_local(local, spec.tp_mesh, spec.tp_placements, shape=param.shape, stride=param.stride())
