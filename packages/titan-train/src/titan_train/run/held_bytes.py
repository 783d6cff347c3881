"""The bytes a rank holds from one step to the next: its parameters, their gradients and the optimizer's
state, counted from the live tensors (a DTensor counts its local shard only, so FSDP's 1/N shows). The dry
run's figures and tools/memory_report.py both come from here."""

from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor


def held_bytes(parameters: Iterable[torch.Tensor], optimizers: Iterable[torch.optim.Optimizer]) -> dict[str, int]:
    """{"params", "grads", "optimizer"} in bytes. Optimizer state counts where it sits on its parameter's
    device: AdamW's moments always, its 0-dim step counters where torch keeps them there (fused or
    capturable AdamW; otherwise they live on the host)."""
    params = list(parameters)
    state = [
        value
        for optimizer in optimizers
        for param, param_state in optimizer.state.items()
        for value in param_state.values()
        if isinstance(value, torch.Tensor) and value.device == param.device
    ]
    return {
        "params": _local_bytes(params),
        "grads": _local_bytes(p.grad for p in params if p.grad is not None),
        "optimizer": _local_bytes(state),
    }


def _local_bytes(tensors: Iterable[torch.Tensor]) -> int:
    total = 0
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        # Its own elements, not its storage's: FSDP's gradients are views into one reduce-scatter buffer.
        total += local.numel() * local.element_size()
    return total
