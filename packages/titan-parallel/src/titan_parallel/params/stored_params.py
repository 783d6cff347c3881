"""Parameters read through a property: the class swap SimpleFSDP and ChannelParallel share, and the switch
that makes such properties hand out the stored tensors instead.

A property on the module's class wins over nn.Module.__getattr__ (which would return the raw tensor from
_parameters or _buffers), while state_dict(), named_parameters(), DCP and to_empty() use those dicts
directly, never the property: checkpoint keys and the stored tensors are unchanged. (FSDP2 reads a
parameter back through getattr in places; channel_parallel.py says how its property allows for that.) Modules of one
class given the same properties share one subclass: dynamo guards on a module's class, and a class per
module would recompile every block instead of reusing the first block's graph.

Initialization must write into the stored tensors, not into what a property computes from them (a
gathered copy, a local view): inside `sharded_params()` the properties return the stored tensors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Partial

_reading_stored = False
_classes: dict[tuple, type] = {}


@contextlib.contextmanager
def sharded_params():
    """Inside, module attributes return the stored (sharded DTensor) parameters and buffers: no gather, no
    local view."""
    global _reading_stored
    previous, _reading_stored = _reading_stored, True
    try:
        yield
    finally:
        _reading_stored = previous


def reading_stored() -> bool:
    """True inside `sharded_params()`."""
    return _reading_stored


def stored(module: nn.Module, name: str) -> torch.Tensor | None:
    """The tensor `module` holds under `name`, parameter or buffer, whatever its class's property returns."""
    return module._parameters[name] if name in module._parameters else module._buffers[name]


def swap_class(module: nn.Module, prefix: str, key: Hashable, namespace: dict[str, Any]) -> None:
    """Make `module` an instance of a subclass of its class named prefix + its class name, with `namespace`
    (properties, class attributes) added. Subclasses are cached by (prefix, class, key): callers pass as
    `key` everything `namespace` is built from."""
    cache_key = (prefix, type(module), key)
    if cache_key not in _classes:
        _classes[cache_key] = type(f"{prefix}{type(module).__name__}", (type(module),), namespace)
    module.__class__ = _classes[cache_key]


# Set on a class ChannelParallel swapped in: the parameter names it reads as local views.
LOCAL_VIEW_NAMES = "_channel_parallel_local_view_names"


def local_view(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's piece of a DTensor, its gradient declared Partial where the DTensor is replicated (so
    DTensor sums it over those ranks); any other tensor unchanged."""
    if not isinstance(tensor, DTensor):
        return tensor
    grad_placements = tuple(Partial() if p.is_replicate() else p for p in tensor.placements)
    return tensor.to_local(grad_placements=grad_placements)


def local_view_names(module: nn.Module) -> frozenset[str]:
    """The names `module` reads as local views because ChannelParallel was applied to it (or its parent)."""
    return getattr(type(module), LOCAL_VIEW_NAMES, frozenset())
