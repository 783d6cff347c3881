"""The whole sequence on every context-parallel rank, for what must see every key without being attention itself:
QK-clip's record of each head's largest logit (titan_models.decoder.max_logit.record_head_max_logits) scores this
rank's queries against all keys. A custom op: a compiled block (fullgraph) sees one opaque collective. Outside
autograd (the record runs under no_grad)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _resolve_process_group


def in_global_order(shards: list[torch.Tensor], seq_dim: int) -> torch.Tensor:
    """The sequence from each rank's load-balanced shard (chunks r and 2 cp - 1 - r of 2 cp), in rank order."""
    cp = len(shards)
    chunks = [None] * (2 * cp)
    for rank, shard in enumerate(shards):
        chunks[rank], chunks[2 * cp - 1 - rank] = shard.chunk(2, dim=seq_dim)
    return torch.cat(chunks, dim=seq_dim)


@torch.library.custom_op("titan::whole_sequence", mutates_args=())
def whole_sequence(shard: torch.Tensor, group_name: str, cp: int, seq_dim: int) -> torch.Tensor:
    """Every rank's shard of a sequence sharded by shard_sequence, in global order (a collective over the group)."""
    shards = [torch.empty_like(shard) for _ in range(cp)]
    dist.all_gather(shards, shard.contiguous(), group=_resolve_process_group(group_name))
    return in_global_order(shards, seq_dim)


@whole_sequence.register_fake
def _(shard, group_name, cp, seq_dim):
    shape = list(shard.shape)
    shape[seq_dim] *= cp
    return shard.new_empty(shape)
