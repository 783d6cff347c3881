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

Channels in blocks (`blocks`, Qwen3-Next's convolution over q | k | v, each split by head): a rank's channels are
its part of each block, which no DTensor placement describes. The named tensors are then stored replicated (whole
on every rank, as a checkpoint holds them) and read as the concatenation of this rank's part of each block, the
gradient of that view declared Partial like a replicated tensor's: each rank's is zero outside its own channels,
so the sum is the whole gradient. Not under SimpleFSDP yet: its view of what it gathers (simple_fsdp.py) is the
whole tensor, not this rank's blocks, and the module fails on the width (a loud shape error, not a wrong result).

A model package declares this style without importing titan-parallel: `apply_tp` turns a plan entry with
`parallel_style == "channel_shard"`, a `sharded` tuple of names and optional `blocks` into
ChannelParallel(sharded, blocks).
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

    def __init__(self, sharded: Iterable[str], blocks: Iterable[int] = ()):
        super().__init__()
        self.sharded = frozenset(sharded)
        self.blocks = tuple(blocks)

    def __repr__(self) -> str:
        blocks = f", blocks={self.blocks}" if self.blocks else ""
        return f"ChannelParallel(sharded={sorted(self.sharded)}{blocks})"

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        tensors = [name for name, _ in module.named_parameters()] + [name for name, _ in module.named_buffers()]
        unknown = sorted(self.sharded - set(tensors))
        if unknown:
            raise ValueError(
                f"ChannelParallel: {type(module).__name__} has no parameter or buffer named "
                f"{', '.join(map(repr, unknown))}; its tensors are {', '.join(tensors)}"
            )
        if self.blocks:
            self._check_blocks(module, device_mesh.size())
        distribute_module(module, device_mesh, self._partition)
        rows = _block_rows(self.blocks, device_mesh) if self.blocks else None
        for prefix, submodule in module.named_modules():
            names = tuple(sorted([*submodule._parameters, *submodule._buffers]))
            if names:
                in_blocks = {name: rows if _join(prefix, name) in self.sharded else None for name in names}
                properties = {name: property(_local_getter(name, device_mesh, in_blocks[name])) for name in names}
                namespace = {**properties, LOCAL_VIEW_NAMES: frozenset(names)}
                swap_class(submodule, _CLASS_PREFIX, (names, device_mesh, tuple(in_blocks.items())), namespace)
        return module

    def _check_blocks(self, module: nn.Module, ranks: int) -> None:
        tensors = dict([*module.named_parameters(), *module.named_buffers()])
        for name in sorted(self.sharded):
            channels = tensors[name].shape[0]
            if sum(self.blocks) != channels or any(size % ranks for size in self.blocks):
                raise ValueError(
                    f"ChannelParallel: {type(module).__name__}.{name} has {channels} channels, which blocks "
                    f"{self.blocks} must add up to, each a multiple of the {ranks} ranks"
                )

    def _partition(self, prefix: str, module: nn.Module, mesh: DeviceMesh) -> None:
        # Blocks are stored whole (module docstring): no placement holds a rank's part of each.
        def placement(name: str):
            return [Shard(0) if _join(prefix, name) in self.sharded and not self.blocks else Replicate()]

        for name, param in list(module.named_parameters(recurse=False)):
            dparam = nn.Parameter(distribute_tensor(param, mesh, placement(name), src_data_rank=self.src_data_rank))
            module.register_parameter(name, dparam)
        for name, buffer in list(module.named_buffers(recurse=False)):
            persistent = name not in module._non_persistent_buffers_set
            dbuffer = distribute_tensor(buffer, mesh, placement(name), src_data_rank=self.src_data_rank)
            module.register_buffer(name, dbuffer, persistent=persistent)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _block_rows(blocks: tuple[int, ...], mesh: DeviceMesh) -> tuple[tuple[int, int], ...]:
    """(start, length) of the channels this rank reads of a tensor whose channels are `blocks` side by side: its
    part of each."""
    rank, ranks = mesh.get_local_rank(), mesh.size()
    return tuple((sum(blocks[:i]) + rank * size // ranks, size // ranks) for i, size in enumerate(blocks))


def _local_getter(name: str, mesh: DeviceMesh, rows: tuple[tuple[int, int], ...] | None = None):
    def get(module: nn.Module) -> torch.Tensor | None:
        value = stored(module, name)
        if reading_stored() or not isinstance(value, DTensor) or value.device_mesh != mesh:
            return value
        view = local_view(value)
        return view if rows is None else torch.cat([view.narrow(0, start, length) for start, length in rows])

    return get
