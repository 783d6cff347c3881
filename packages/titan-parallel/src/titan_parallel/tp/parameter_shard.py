"""ShardParameters: tensor parallelism for single parameters that follow the heads, beside the owner module's own
style.

GPT-OSS's attention sinks ([n_heads], one logit per query head) live on the attention module, whose plan entry
already prepares its input (PrepareModuleInput on "layers.*.attention"); a plan is keyed by FQN, so a second style
for that module cannot sit beside the first. A plan names such a parameter by its own FQN instead
("layers.*.attention.sinks", a declared style with parallel_style == "parameter_shard", e.g.
titan_models.tp_styles.ParameterShard), and apply_tp applies this style to the owner module in a second pass: it
only turns the named parameters into DTensors sharded on their dim, so it registers no hooks and composes with
whatever the owner's own entry did. Rank r holds heads [r * n / tp, (r + 1) * n / tp) of the column-wise wq / wk /
wv (they shard the heads in order) and the same part of a Shard(0) per-head parameter.

The module reads that part as a plain local tensor, through a property on a swapped class (stored_params.py), as
ChannelParallel's modules do: model code need not unwrap a DTensor itself (an unwrap by duck typing,
`hasattr(p, "to_local")`, is False for a DTensor inside a torch.compile'd block, where dynamo answers hasattr from
torch.Tensor's attributes). The property hands out the stored DTensor inside `sharded_params()` and where it is not
on the style's mesh (FSDP2 reads back its (dp, tp) parameter through getattr; in forward it holds the tp one), and
names the parameters as local views, so SimpleFSDP hands out the local view of what it gathers.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle

from titan_parallel.params.stored_params import (
    LOCAL_VIEW_NAMES,
    local_view,
    local_view_names,
    reading_stored,
    stored,
    swap_class,
)

_CLASS_PREFIX = "ShardParameters"


class ShardParameters(ParallelStyle):
    """Shard each parameter of the module named in `dims` ({"sinks": 0}) on that dim over the mesh."""

    def __init__(self, dims: dict[str, int]):
        super().__init__()
        self.dims = dict(dims)

    def __repr__(self) -> str:
        return f"ShardParameters({self.dims})"

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        for name, dim in self.dims.items():
            param = module._parameters.get(name)
            if param is None:
                raise ValueError(
                    f"ShardParameters: {type(module).__name__} has no parameter {name!r} (its parameters: "
                    f"{', '.join(module._parameters) or 'none'}); the plan names a parameter the model does not hold"
                )
            if isinstance(param, DTensor):
                raise ValueError(
                    f"ShardParameters: {type(module).__name__}.{name} is already a DTensor {param.placements}"
                )
            if param.dim() <= dim or param.shape[dim] % device_mesh.size():
                raise ValueError(
                    f"ShardParameters: {type(module).__name__}.{name} of shape {tuple(param.shape)} does not split on "
                    f"dim {dim} over {device_mesh.size()} ranks"
                )
            sharded = distribute_tensor(param.data, device_mesh, (Shard(dim),), src_data_rank=self.src_data_rank)
            module.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))
        names = tuple(sorted(self.dims))
        properties = {name: property(_local_getter(name, device_mesh)) for name in names}
        namespace = {**properties, LOCAL_VIEW_NAMES: local_view_names(module) | frozenset(names)}
        swap_class(module, _CLASS_PREFIX, (names, device_mesh), namespace)
        return module


def _local_getter(name: str, mesh: DeviceMesh):
    def get(module: nn.Module) -> torch.Tensor | None:
        value = stored(module, name)
        if reading_stored() or not isinstance(value, DTensor) or value.device_mesh != mesh:
            return value
        return local_view(value)

    return get
