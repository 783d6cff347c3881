"""How Hyena's channel-wise modules read their parameters under tensor parallelism.

The short convolution and the implicit filter act on each channel alone, so the tensor-parallel plan
(plan.py) shards their per-channel tensors on dim 0 and replicates the rest (the filter MLP that every
channel shares). Their forwards compute on plain local tensors, reading each parameter through `local`.
Without tensor parallelism (one device, FSDP, DDP) parameters are plain tensors and `local` returns them.
"""

from __future__ import annotations

import torch


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's piece of a tensor-parallel DTensor; any other tensor unchanged.

    A replicated parameter (the filter MLP) feeds only this rank's channels, so each rank's gradient is a
    partial sum: it is marked Partial and DTensor sums it over the ranks. A sharded one's gradient is its
    own shard.
    """
    if not hasattr(tensor, "to_local"):
        return tensor
    from torch.distributed.tensor import Partial

    grad_placements = tuple(Partial() if p.is_replicate() else p for p in tensor.placements)
    return tensor.to_local(grad_placements=grad_placements)
