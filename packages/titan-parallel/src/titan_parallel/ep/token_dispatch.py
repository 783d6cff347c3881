"""Expert parallelism's token dispatch: each of the `ep` ranks of a group holds `num_experts / ep` of the
routed experts, and the rows routed to an expert held elsewhere travel there and back by uneven all-to-all.

In: this rank's rows sorted by global expert, `counts[e]` rows for expert e (as a mixture-of-experts layer
hands them to its experts). Rank r holds experts r * L .. (r + 1) * L - 1 (L = num_experts / ep), so the rows
for rank r are one contiguous run.

1. The counts are exchanged: received[r, j] = the rows rank r sends for this rank's local expert j.
2. The rows move with one uneven all-to-all (autograd: the gradients travel back the same way).
3. They arrive source-major (from rank 0: expert 0, 1, ...; from rank 1: ...); the grouped matmul wants them
   expert-major, so they are permuted, and the local counts give its offsets.
Combine undoes 3 and 2: the outputs come back in the order the rows left.

The counts are read on the host once (`split_sizes`: they size the all-to-all and the permutation); a dry
run, whose tensors hold no data, puts balanced routing in their place there.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import all_to_all_single_autograd

from titan_parallel.mesh.near_equal import near_equal_sizes


@dataclass
class Dispatch:
    """How one batch of rows was dispatched, for its combine."""

    sent: list[int]  # rows sent to each rank
    received: list[int]  # rows received from each rank
    inverse: torch.Tensor  # expert-major position -> source-major position (undoes the permutation)


def exchange_counts(counts: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """[ep, L]: row r holds the counts rank r sends for this rank's L local experts."""
    ep = dist.get_world_size(group)
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts.contiguous(), group=group)
    return received.view(ep, -1)


def split_sizes(rows: torch.Tensor, counts: torch.Tensor, received: torch.Tensor) -> tuple[list[int], list[list[int]]]:
    """On the host: the rows sent to each rank, and received[r][j] (rows from rank r for local expert j)."""
    ep = received.shape[0]
    return counts.view(ep, -1).sum(1).tolist(), received.tolist()


def balanced_split_sizes(rows: torch.Tensor, counts: torch.Tensor, received: torch.Tensor):
    """What `split_sizes` would read if every expert got the same share of every rank's rows (a dry run's
    stand-in: its counts hold no data). Host arithmetic only: a dry run simulates every tensor op it is given."""
    ep, local = received.shape
    share = near_equal_sizes(rows.shape[0], ep * local)
    per_rank = [sum(share[r * local : (r + 1) * local]) for r in range(ep)]
    mine = share[:local]
    return per_rank, [mine] * ep


def expert_major_order(received: list[list[int]], device: torch.device | None = None) -> torch.Tensor:
    """The permutation taking source-major rows (rank, expert) to expert-major ones (expert, rank). Built from
    the block sizes in a fixed handful of ops (one range shifted block by block), not one per (rank, expert)
    block: an MoE layer of 128 experts on 8 ranks would otherwise launch 128 ranges and a cat per forward."""
    ep, local = len(received), len(received[0]) if received else 0
    # The start of block (r, j) among the source-major rows: the sizes before it, rank by rank.
    source_starts = list(accumulate((size for row in received for size in row), initial=0))
    sizes, shifts, destination = [], [], 0
    for j in range(local):
        for r in range(ep):
            sizes.append(received[r][j])
            shifts.append(source_starts[r * local + j] - destination)  # where the block's rows sit minus where they go
            destination += received[r][j]
    if destination == 0:
        return torch.zeros(0, dtype=torch.int64, device=device)
    shift_per_row = torch.tensor(shifts, device=device).repeat_interleave(
        torch.tensor(sizes, device=device), output_size=destination
    )
    return torch.arange(destination, device=device) + shift_per_row


def dispatch(
    rows: torch.Tensor, counts: torch.Tensor, group: dist.ProcessGroup
) -> tuple[torch.Tensor, torch.Tensor, Dispatch]:
    """rows [n, dim] sorted by global expert, counts [num_experts] -> (this rank's rows for its local experts,
    expert-major; their offsets [L] int32; the Dispatch for `combine`)."""
    counts = counts.to(torch.int64)
    sent, received = split_sizes(rows, counts, exchange_counts(counts, group))
    from_each = [sum(row) for row in received]
    arrived = all_to_all_single_autograd(rows, from_each, sent, group)
    order = expert_major_order(received, rows.device)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    per_expert = [sum(row[j] for row in received) for j in range(len(received[0]))]
    offsets = torch.tensor(per_expert, device=rows.device).cumsum(0).to(torch.int32)
    return arrived[order], offsets, Dispatch(sent, from_each, inverse)


def combine(outputs: torch.Tensor, dispatched: Dispatch, group: dist.ProcessGroup) -> torch.Tensor:
    """The local experts' outputs (expert-major) back to the ranks and order their rows came from."""
    source_major = outputs[dispatched.inverse]
    return all_to_all_single_autograd(source_major, dispatched.sent, dispatched.received, group)
