"""Orthogonalize a DTensor as the whole matrix it stands for, and keep this rank's shard of the result.

Newton-Schulz mixes every row with every column, so a row shard (FSDP), a column or row shard (TP) or any
mix of them orthogonalized alone gives another matrix entirely. Each sharded matrix is gathered whole
(one all-gather of its momentum-updated gradient per step), orthogonalized on every rank alike (the same
input and operations give the same bits everywhere), and each rank keeps its own slice: no second
collective. A stack of expert matrices split only by expert (expert parallel: Shard(0)) holds whole
matrices already and is orthogonalized where it is, with no communication at all.
"""

from collections.abc import Callable

import torch
from torch.distributed.tensor import DTensor, distribute_tensor


def holds_whole_matrices(tensor: DTensor) -> bool:
    """True when every local block is a set of whole matrices: a stack split only on its leading dim."""
    return tensor.ndim == 3 and all(not p.is_partial() and (not p.is_shard() or p.dim == 0) for p in tensor.placements)


def orthogonalize_whole(update: torch.Tensor, orthogonalize: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """`orthogonalize` applied to the whole `update` (a plain tensor or a DTensor), placed as `update` is."""
    if not isinstance(update, DTensor):
        return orthogonalize(update)
    if holds_whole_matrices(update):
        local = orthogonalize(update.to_local()).contiguous()
        return DTensor.from_local(
            local, update.device_mesh, update.placements, run_check=False, shape=update.shape, stride=update.stride()
        )
    whole = orthogonalize(update.full_tensor())
    # src_data_rank=None: every rank holds the same `whole`, so each slices its own part without a scatter.
    return distribute_tensor(whole, update.device_mesh, update.placements, src_data_rank=None)
