"""Context parallelism: the sequence split over the cp ranks, and SDPA routed to ring attention meanwhile.

Causal attention gives late tokens more work than early ones, so a plain split would leave the last rank
with most of it. The sequence is cut into 2*cp chunks and rank i holds chunks i and 2*cp-1-i (one early, one
late): every rank does the same work. Tokens, labels and positions are sharded alike; RoPE follows the
global positions (`load_balanced_positions`). Every rank holds the same number of tokens, so the mean of the
ranks' mean losses is the loss of the whole sequence.

    tokens, labels = shard_sequence([tokens, labels], cp_mesh)
    positions = load_balanced_positions(seq_len, cp_mesh.size(), cp_mesh.get_local_rank(), tokens.device)
    with context_parallel_attention(cp_mesh):
        loss = loss_fn(model(tokens, positions), labels)
        loss.backward()   # inside too: activation checkpointing re-runs attention in backward
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

from titan_parallel.ring_attention import VARIANTS, ring_attention_by_name
from titan_parallel.ring_comm import cp_group

IMPLEMENTATIONS = ("titan", "torch")


def load_balanced_positions(seq_len: int, cp: int, rank: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Global positions of the tokens rank `rank` of `cp` holds, in local order: chunks rank and
    2*cp-1-rank of 2*cp equal chunks."""
    if seq_len % (2 * cp):
        valid = ", ".join(str(2 * cp * m) for m in range(max(1, seq_len // (2 * cp)), seq_len // (2 * cp) + 3))
        raise ValueError(
            f"sequence length {seq_len} is not divisible by 2 x context_parallel_degree = {2 * cp} (each rank "
            f"holds two equal chunks for causal load balancing); use a multiple of {2 * cp}, e.g. {valid}"
        )
    chunk = seq_len // (2 * cp)
    first = torch.arange(rank * chunk, (rank + 1) * chunk, device=device)
    return torch.cat([first, first + (2 * cp - 1 - 2 * rank) * chunk])


def shard_sequence(
    tensors: Sequence[torch.Tensor], cp_mesh: DeviceMesh | dist.ProcessGroup, seq_dim: int = 1
) -> list[torch.Tensor]:
    """This rank's load-balanced shard of each tensor along `seq_dim` (e.g. tokens and labels [B, S])."""
    group = cp_group(cp_mesh)
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    shards = []
    for tensor in tensors:
        index = load_balanced_positions(tensor.shape[seq_dim], cp, rank, tensor.device)
        shards.append(tensor.index_select(seq_dim, index))
    return shards


def unshard_sequence(tensor: torch.Tensor, cp_mesh: DeviceMesh | dist.ProcessGroup, seq_dim: int = 1) -> torch.Tensor:
    """The whole sequence from every rank's shard, in global order (a collective; not differentiable)."""
    group = cp_group(cp_mesh)
    cp = dist.get_world_size(group)
    shards = [torch.empty_like(tensor) for _ in range(cp)]
    dist.all_gather(shards, tensor.contiguous(), group=group)
    chunks = [None] * (2 * cp)
    for rank, shard in enumerate(shards):
        chunks[rank], chunks[2 * cp - 1 - rank] = shard.chunk(2, dim=seq_dim)
    return torch.cat(chunks, dim=seq_dim)


@contextlib.contextmanager
def context_parallel_attention(
    cp_mesh: DeviceMesh | dist.ProcessGroup,
    *,
    variant: str = "p2p",
    implementation: str = "titan",
    kernel: str = "auto",
) -> Iterator[None]:
    """While active, `torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=...)` runs ring
    attention over `cp_mesh`, on inputs sharded by `shard_sequence`. Models need no change, as long as
    they call it as `F.scaled_dot_product_attention` (looked up at call time).

    Cover forward *and* backward: activation checkpointing re-runs attention during backward.
    `variant`: "p2p" or "allgather" (see ring_attention.py). `implementation`: "titan" (this ring
    attention, any device) or "torch" (torch's experimental `context_parallel`, CUDA only: its sharding
    order is the same head-tail one). `kernel`: per-block kernel of the titan ring, see `ring_attention`.
    """
    if variant not in VARIANTS:
        raise ValueError(f"context parallel variant={variant!r} is not one of {VARIANTS}")
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"context parallel implementation={implementation!r} is not one of {IMPLEMENTATIONS}")
    if implementation == "torch":
        with _torch_context_parallel(cp_mesh, variant):
            yield
        return

    original = F.scaled_dot_product_attention
    # Resolved here, outside any compiled region: the patched SDPA passes only plain values to the op.
    group = cp_group(cp_mesh)
    name, size = group.group_name, dist.get_world_size(group)

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is not None or dropout_p:
            mask = None if attn_mask is None else tuple(attn_mask.shape)
            raise NotImplementedError(
                f"context parallel attention takes no attn_mask and no dropout (got attn_mask={mask}, "
                f"dropout_p={dropout_p}); use is_causal=True for a causal mask and dropout_p=0, or disable "
                f"context parallelism"
            )
        return ring_attention_by_name(query, key, value, name, size, is_causal, scale, variant, kernel)

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


@contextlib.contextmanager
def _torch_context_parallel(cp_mesh, variant: str) -> Iterator[None]:
    if not isinstance(cp_mesh, DeviceMesh) or cp_mesh.device_type != "cuda":
        kind = cp_mesh.device_type if isinstance(cp_mesh, DeviceMesh) else type(cp_mesh).__name__
        raise ValueError(
            f"context parallel implementation='torch' needs a CUDA DeviceMesh (torch's context_parallel has no "
            f"CPU attention strategy), got {kind}; use implementation='titan'"
        )
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._context_parallel import set_rotate_method

    set_rotate_method("alltoall" if variant == "p2p" else "allgather")
    # Our inputs are sharded already (same order as torch's head-tail balancer); torch only needs a buffer
    # to shard, so give it a throwaway one and keep just its SDPA dispatch.
    placeholder = torch.empty(2 * cp_mesh.size(), device="cuda")
    with context_parallel(cp_mesh, buffers=[placeholder], buffer_seq_dims=[0], no_restore_buffers={placeholder}):
        yield
