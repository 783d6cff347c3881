"""Communication for ring attention: the ring's point-to-point hop, the all-gather / reduce-scatter of the
all-gather variant, and the one gather of every rank's document ids. Several tensors travel packed in one flat
buffer, so a hop is one message."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

# Point-to-point tags: K/V blocks and their gradient accumulators can be in flight at once between the same
# two ranks (backward); distinct tags keep gloo from pairing one's send with the other's receive.
KV_TAG, GRAD_TAG = 7001, 7002


def cp_group(group_or_mesh: dist.ProcessGroup | DeviceMesh) -> dist.ProcessGroup:
    """The process group of a 1-D context-parallel mesh (or the group itself)."""
    if isinstance(group_or_mesh, DeviceMesh):
        if group_or_mesh.ndim != 1:
            raise ValueError(
                f"context parallelism needs a 1-D mesh (e.g. mesh['cp']), got {group_or_mesh.ndim}-D "
                f"dims {group_or_mesh.mesh_dim_names}"
            )
        return group_or_mesh.get_group()
    return group_or_mesh


def pack(*tensors: torch.Tensor) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def unpack(buffer: torch.Tensor, shapes: Sequence[torch.Size]) -> list[torch.Tensor]:
    """Views of `buffer` with the given shapes (the inverse of `pack`)."""
    views, start = [], 0
    for shape in shapes:
        n = shape.numel()
        views.append(buffer[start : start + n].view(shape))
        start += n
    return views


class Ring:
    """Rank r sends to r + 1 and receives from r - 1 (mod the group size)."""

    def __init__(self, group: dist.ProcessGroup):
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def start(self, buffer: torch.Tensor, tag: int) -> Hop:
        """Send `buffer` on and receive the previous rank's (same shape) without waiting for either."""
        if self.size == 1:
            return Hop(buffer, [])
        received = torch.empty_like(buffer)
        ops = [
            dist.P2POp(dist.isend, buffer, group=self.group, group_peer=(self.rank + 1) % self.size, tag=tag),
            dist.P2POp(dist.irecv, received, group=self.group, group_peer=(self.rank - 1) % self.size, tag=tag),
        ]
        return Hop(received, dist.batch_isend_irecv(ops), sent=buffer)

    def blocks(self, buffer: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
        """(source rank, its buffer) for every rank, own first; the next hop is in flight while the caller
        works on the current block."""
        for step in range(self.size):
            hop = self.start(buffer, KV_TAG) if step + 1 < self.size else None
            yield (self.rank - step) % self.size, buffer
            if hop is not None:
                buffer = hop.wait()


class Hop:
    def __init__(self, received: torch.Tensor, works: list, sent: torch.Tensor | None = None):
        self.received, self.works = received, works
        self.sent = sent  # kept alive until the send completes

    def wait(self) -> torch.Tensor:
        for work in self.works:
            work.wait()
        self.sent = None
        return self.received


def gathered_blocks(buffer: torch.Tensor, group: dist.ProcessGroup) -> Iterator[tuple[int, torch.Tensor]]:
    """The all-gather variant of `Ring.blocks`: one collective, then every rank's buffer, own first."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    gathered = torch.empty(size * buffer.numel(), dtype=buffer.dtype, device=buffer.device)
    dist.all_gather_single(gathered, buffer, group=group)
    chunks = gathered.view(size, -1)
    for step in range(size):
        source = (rank - step) % size
        yield source, chunks[source]


def reduce_scatter_sum(stacked: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Row r of `stacked` [size, n], summed over ranks, lands on rank r."""
    out = torch.empty(stacked.shape[1:], dtype=stacked.dtype, device=stacked.device)
    dist.reduce_scatter_single(out, stacked.reshape(-1), group=group)
    return out


def gather_documents(document_ids: torch.Tensor | None, group: dist.ProcessGroup) -> list[torch.Tensor] | None:
    """Every rank's document ids [B, S_local], in rank order (None without document masking)."""
    if document_ids is None:
        return None
    everyone = [torch.empty_like(document_ids) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, document_ids.contiguous(), group=group)
    return everyone
