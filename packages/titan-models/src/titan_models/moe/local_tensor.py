"""What a rank computes with: the local part of a weight that parallelism made a DTensor."""

from __future__ import annotations

import torch


def local_tensor(weight: torch.Tensor) -> torch.Tensor:
    """This rank's part of `weight`: the experts it holds under expert parallelism, its slice of the hidden
    units under tensor parallelism, the whole (replicated) router weight; a plain tensor as it is (FSDP
    gathers plain tensors)."""
    # Imported here: model code stays importable and usable without torch.distributed.
    from torch.distributed.tensor import DTensor

    return weight.to_local() if isinstance(weight, DTensor) else weight
