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
    return {
        "params": _local_bytes(params),
        "grads": _local_bytes(p.grad for p in params if p.grad is not None),
        "optimizer": sum(_state_bytes(o.state) for o in optimizers),
    }


def optimizer_bytes_by_kind(optimizers: Iterable[torch.optim.Optimizer]) -> dict[str, int] | None:
    """{"muon", "adamw"}: the "optimizer" bytes of held_bytes split between Muon's groups (one momentum buffer
    per matrix) and AdamW's (two moments and a step counter per tensor); None where no optimizer has a Muon
    group (titan_parallel's Muon marks its groups with `use_muon`)."""
    optimizers = list(optimizers)
    groups = [(o, g) for o in optimizers for g in o.param_groups]
    if not any(g.get("use_muon", False) for _, g in groups):
        return None
    split = {"muon": 0, "adamw": 0}
    for optimizer, group in groups:
        state = {p: optimizer.state[p] for p in group["params"] if p in optimizer.state}
        split["muon" if group.get("use_muon", False) else "adamw"] += _state_bytes(state)
    return split


def _state_bytes(state: dict) -> int:
    """State counts where it sits on its parameter's device (see held_bytes)."""
    return _local_bytes(
        value
        for param, param_state in state.items()
        for value in param_state.values()
        if isinstance(value, torch.Tensor) and value.device == param.device
    )


def _local_bytes(tensors: Iterable[torch.Tensor]) -> int:
    total = 0
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        # Its own elements, not its storage's: FSDP's gradients are views into one reduce-scatter buffer.
        total += local.numel() * local.element_size()
    return total
