"""Expert parallelism: the routed experts' weights split over an expert-parallel group by expert, and the
rows routed to them moved there and back (token_dispatch.py).

The model's plan names its routed-experts modules (`expert_fqns`, e.g. "layers.*.feed_forward.experts"):
modules whose parameters are stacked per expert on dim 0 and whose forward takes `(rows, offsets)`, rows
sorted by expert and `offsets[e]` the end of expert e's rows, returning one output row per input row. The
model knows nothing of the group: hooks around each such module dispatch its input and combine its output,
and its parameters become DTensors sharded on dim 0 over the group (so checkpoints keep the global shape
and load on any other expert-parallel degree).

Beside tensor parallelism the tp ranks are part of the group (TorchTitan's ETP = 1: routed experts are never
split on their hidden units), and each of them holds the same rows (the layer's whole sequence, gathered
for attention's sake and routed alike on every tp rank: titan_parallel.tp.moe_parallel). So each tp rank
dispatches only its share of them, an equal run of the expert-sorted rows, and its output is zero elsewhere:
a partial sum over the tp ranks, which the layer's style reduce-scatters back over the sequence.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

from titan_parallel.ep.token_dispatch import Dispatch, combine, dispatch
from titan_parallel.params.module_patterns import modules_matching


def apply_ep(
    model: nn.Module, ep_mesh: DeviceMesh, expert_fqns: list[str], tp_mesh: DeviceMesh | None = None
) -> list[nn.Module]:
    """Shard every routed-experts module over `ep_mesh` (1-D) and route its rows; returns the modules.
    `tp_mesh`: the tensor-parallel ranks (part of `ep_mesh`), which hold the same rows and each dispatch
    their share of them."""
    ep = ep_mesh.size()
    modules = modules_matching(model, expert_fqns)
    for fqn, module in modules.items():
        for name, param in list(module.named_parameters(recurse=False)):
            if param.shape[0] % ep:
                raise ValueError(f"{fqn}.{name}: {param.shape[0]} experts do not split over ep={ep} ranks")
            sharded = nn.Parameter(distribute_tensor(param, ep_mesh, [Shard(0)]), requires_grad=param.requires_grad)
            module.register_parameter(name, sharded)
        _route(module, ep_mesh.get_group(), tp_mesh.get_group() if tp_mesh is not None else None)
    return list(modules.values())


def _route(module: nn.Module, group, tp_group=None) -> None:
    # A forward's dispatch and the share of rows it took, for its combine (recomputation re-enters in order).
    in_flight: list[tuple[Dispatch, int, int, int]] = []

    @torch.compiler.disable  # host-synchronised split sizes: runs eagerly between a compiled block's graphs
    def dispatch_rows(module, args):
        rows, offsets = args
        start, end = _share(rows.shape[0], tp_group)
        ends = offsets.to(torch.int64).clamp(start, end) - start  # this share's run ends, expert by expert
        counts = torch.diff(ends, prepend=ends.new_zeros(1))
        local_rows, local_offsets, dispatched = dispatch(rows[start:end], counts, group)
        in_flight.append((dispatched, start, end, rows.shape[0]))
        return local_rows, local_offsets

    @torch.compiler.disable
    def combine_rows(module, args, output):
        dispatched, start, end, total = in_flight.pop()
        share = combine(output, dispatched, group)
        return share if end - start == total else F.pad(share, (0, 0, start, total - end))

    module.register_forward_pre_hook(dispatch_rows)
    module.register_forward_hook(combine_rows)
    module._titan_expert_parallel = group  # read back by describe_applied


def _share(rows: int, tp_group) -> tuple[int, int]:
    """This tp rank's equal run [start, end) of `rows` (all of them without tensor parallelism)."""
    if tp_group is None:
        return 0, rows
    size, rank = dist.get_world_size(tp_group), dist.get_rank(tp_group)
    return rows * rank // size, rows * (rank + 1) // size
