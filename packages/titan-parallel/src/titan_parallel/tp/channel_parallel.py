"""ChannelParallel: tensor parallelism for modules that compute each channel on its own.

A depthwise convolution, a per-channel filter, a per-channel scale: give each rank a contiguous slice of
the channels and the module's forward is the same code on fewer channels. The style shards the named
per-channel parameters and buffers on dim 0 (the channel dim) and replicates the rest, and the module
reads plain local tensors, this rank's slice, so its code knows nothing of DTensor. Its inputs and outputs
are plain local tensors too: the surrounding plan hands it this rank's channels (a ColwiseParallel layer
before it, a RowwiseParallel one after).

A replicated tensor (e.g. a small MLP every channel shares) feeds only this rank's channels, so each rank's
gradient for it is a partial sum: its local view is marked Partial and DTensor sums the gradient over the
tensor-parallel ranks. A sharded tensor's gradient is its own shard.

The local view is a property on a swapped class (stored_params.py), computed afresh at every access from
what the module holds at the time, and only for a DTensor on the style's own mesh, as it laid them out:
- FSDP2 over tensor parallelism stores each parameter on the joint (dp, tp) mesh and reads it back through
  getattr (reset_sharded_param, in to_empty() and at its lazy init), so that one is returned as stored;
  during forward FSDP2 holds the unsharded parameter, on the tp mesh again, and the module reads its view.
- SimpleFSDP overrides the parameters' properties; it takes the local view of what it gathers, for the
  names `local_view_names` gives (simple_fsdp.py).
- Under `sharded_params()` the properties return the stored DTensors: init_weights writes each rank's shard.

A model package declares this style without importing titan-parallel: `apply_tp` turns a plan entry with
`parallel_style == "channel_shard"` and a `sharded` tuple of names into ChannelParallel(sharded).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle

from titan_parallel.params.stored_params import LOCAL_VIEW_NAMES, local_view, reading_stored, stored, swap_class

_CLASS_PREFIX = "ChannelParallel"


class ChannelParallel(ParallelStyle):
    """Shard the parameters and buffers named in `sharded` (relative to the module the style is applied
    to, e.g. "out.weight") on dim 0 and replicate the others; the module and its submodules then read
    plain local tensors (module docstring)."""

    def __init__(self, sharded: Iterable[str]):
        super().__init__()
        self.sharded = frozenset(sharded)

    def __repr__(self) -> str:
        return f"ChannelParallel(sharded={sorted(self.sharded)})"

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        tensors = [name for name, _ in module.named_parameters()] + [name for name, _ in module.named_buffers()]
        unknown = sorted(self.sharded - set(tensors))
        if unknown:
            raise ValueError(
                f"ChannelParallel: {type(module).__name__} has no parameter or buffer named "
                f"{', '.join(map(repr, unknown))}; its tensors are {', '.join(tensors)}"
            )
        distribute_module(module, device_mesh, self._partition)
        for submodule in module.modules():
            names = tuple(sorted([*submodule._parameters, *submodule._buffers]))
            if names:
                properties = {name: property(_local_getter(name, device_mesh)) for name in names}
                namespace = {**properties, LOCAL_VIEW_NAMES: frozenset(names)}
                swap_class(submodule, _CLASS_PREFIX, (names, device_mesh), namespace)
        return module

    def _partition(self, prefix: str, module: nn.Module, mesh: DeviceMesh) -> None:
        def placement(name: str):
            return [Shard(0) if (f"{prefix}.{name}" if prefix else name) in self.sharded else Replicate()]

        for name, param in list(module.named_parameters(recurse=False)):
            dparam = nn.Parameter(distribute_tensor(param, mesh, placement(name), src_data_rank=self.src_data_rank))
            module.register_parameter(name, dparam)
        for name, buffer in list(module.named_buffers(recurse=False)):
            persistent = name not in module._non_persistent_buffers_set
            dbuffer = distribute_tensor(buffer, mesh, placement(name), src_data_rank=self.src_data_rank)
            module.register_buffer(name, dbuffer, persistent=persistent)


def _local_getter(name: str, mesh: DeviceMesh):
    def get(module: nn.Module) -> torch.Tensor | None:
        value = stored(module, name)
        if reading_stored() or not isinstance(value, DTensor) or value.device_mesh != mesh:
            return value
        return local_view(value)

    return get
