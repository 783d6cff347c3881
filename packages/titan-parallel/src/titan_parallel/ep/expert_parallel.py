"""Expert parallelism: the routed experts' weights split over an expert-parallel group by expert, and the
rows routed to them moved there and back (token_dispatch.py).

The model's plan names its routed-experts modules (`expert_fqns`, e.g. "layers.*.feed_forward.experts"):
modules whose parameters are stacked per expert on dim 0 and whose forward takes `(rows, offsets)`, rows
sorted by expert and `offsets[e]` the end of expert e's rows, returning one output row per input row. The
model knows nothing of the group: hooks around each such module dispatch its input and combine its output,
and its parameters become DTensors sharded on dim 0 over the group (so checkpoints keep the global shape
and load on any other expert-parallel degree).
"""

from __future__ import annotations

import fnmatch

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

from titan_parallel.ep.token_dispatch import Dispatch, combine, dispatch


def expert_modules(model: nn.Module, expert_fqns: list[str]) -> dict[str, nn.Module]:
    """The modules of `model` whose FQN matches a pattern ("*" matches one name)."""
    found = {}
    for fqn, module in model.named_modules():
        depth = fqn.count(".")
        if any(pattern.count(".") == depth and fnmatch.fnmatchcase(fqn, pattern) for pattern in expert_fqns):
            found[fqn] = module
    return found


def apply_ep(model: nn.Module, ep_mesh: DeviceMesh, expert_fqns: list[str]) -> list[nn.Module]:
    """Shard every routed-experts module over `ep_mesh` (1-D) and route its rows; returns the modules."""
    ep = ep_mesh.size()
    modules = expert_modules(model, expert_fqns)
    for fqn, module in modules.items():
        for name, param in list(module.named_parameters(recurse=False)):
            if param.shape[0] % ep:
                raise ValueError(f"{fqn}.{name}: {param.shape[0]} experts do not split over ep={ep} ranks")
            sharded = nn.Parameter(distribute_tensor(param, ep_mesh, [Shard(0)]), requires_grad=param.requires_grad)
            module.register_parameter(name, sharded)
        _route(module, ep_mesh.get_group())
    return list(modules.values())


def _route(module: nn.Module, group) -> None:
    in_flight: list[Dispatch] = []  # a forward's dispatch, for its combine (recomputation re-enters in order)

    @torch.compiler.disable  # host-synchronised split sizes: runs eagerly between a compiled block's graphs
    def dispatch_rows(module, args):
        rows, offsets = args
        counts = torch.diff(offsets, prepend=offsets.new_zeros(1))
        local_rows, local_offsets, dispatched = dispatch(rows, counts, group)
        in_flight.append(dispatched)
        return local_rows, local_offsets

    @torch.compiler.disable
    def combine_rows(module, args, output):
        return combine(output, in_flight.pop(), group)

    module.register_forward_pre_hook(dispatch_rows)
    module.register_forward_hook(combine_rows)
    module._titan_expert_parallel = group  # read back by describe_applied
