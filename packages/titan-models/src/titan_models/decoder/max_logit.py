"""The largest attention logit of each query head, and the rescaling that brings a head's logits down: what Kimi K2's
QK-clip (MuonClip, arXiv:2507.20534) needs from a model. An attention module records its heads' maxima when its
`record_max_logit` flag is set (off by default: one bool test per forward) and names, through `qk_clip_updates`,
which rows of which parameters to scale so that head h's logits scale by gamma[h]. Knowing nothing of parallelism:
the caller maps the recorded heads and the updated rows to whatever shards it holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from titan_models.decoder.attention_kernels import visible

SCORES_PER_CHUNK = 2**24
"""Scores held at a time (64 MiB in float32): queries are scored in chunks of rows, never the whole square."""


@torch.no_grad()
def head_max_logits(
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float,
    *,
    document_ids: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    window: int | None = None,
    causal: bool = True,
    key_positions: torch.Tensor | None = None,
    key_document_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """max over batch, queries and the keys each query attends of (q . k) * scale, per query head: [heads], float32.

    q [bs, heads, seqlen, d]; k [bs, heads or kv_heads, keys, d] (query head h reads key head h // (heads //
    kv_heads)), both after RoPE. The mask is the kernels' own (attention_kernels.visible): causal, documents
    (document_ids [bs, seqlen]) and a window measured in `positions` ([seqlen] or [bs, seqlen]; None: 0..seqlen-1).
    The keys' positions and documents are the queries' unless given (`key_positions`, `key_document_ids`: keys that
    are not the queries' own, e.g. the whole sequence of which a context-parallel rank holds the queries)."""
    bs, heads, seqlen, _ = q.shape
    key_heads, n_keys = k.shape[1], k.shape[2]
    # Query heads grouped by the key head they read: [bs, key_heads, heads / key_heads, seqlen, d], the keys never
    # repeated (under context parallelism they are the whole sequence's).
    q = q.unflatten(1, (key_heads, heads // key_heads))
    # Causal over 0..seqlen-1: a chunk of queries reads no key after its last one.
    ordered = causal and positions is None and key_positions is None
    if positions is None:
        positions = torch.arange(seqlen, device=q.device)
    positions = positions.expand(bs, seqlen) if positions.dim() == 1 else positions
    key_positions = positions if key_positions is None else key_positions.expand(bs, n_keys)
    key_document_ids = document_ids if key_document_ids is None else key_document_ids
    k32 = k.float().transpose(-1, -2).unsqueeze(2)
    best = torch.full((heads,), float("-inf"), device=q.device)
    chunk = max(1, SCORES_PER_CHUNK // (bs * heads * n_keys))
    for start in range(0, seqlen, chunk):
        rows, keys = slice(start, start + chunk), slice(0, min(start + chunk, seqlen) if ordered else n_keys)
        scores = torch.matmul(q[:, :, :, rows].float(), k32[..., keys]) * scale
        keep = visible(
            positions[:, rows, None],
            key_positions[:, None, keys],
            None if document_ids is None else document_ids[:, rows, None],
            None if document_ids is None else key_document_ids[:, None, keys],
            causal,
            window,
        )
        scores.masked_fill_(~keep[:, None, None], float("-inf"))
        best = torch.maximum(best, scores.amax(dim=(0, 3, 4)).flatten())
    return best


def record_head_max_logits(
    kernel: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, scale: float, **mask
) -> torch.Tensor:
    """head_max_logits over every key the queries attend (`mask`: its document_ids, positions, window), where the
    attention module's kernel `kernel` runs them. A kernel that holds only part of the sequence (context
    parallelism's ring) names the rest: its `keys_for_max_logit(k, document_ids)` returns (every key, the queries'
    positions, the keys' positions, the keys' documents), the positions global."""
    whole = getattr(kernel, "keys_for_max_logit", None)
    if whole is None:
        return head_max_logits(q, k, scale, **mask)
    keys, query_positions, key_positions, key_documents = whole(k, mask.get("document_ids"))
    mask = {**mask, "positions": query_positions, "key_positions": key_positions, "key_document_ids": key_documents}
    return head_max_logits(q, keys, scale, **mask)


def running_max(recorded: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """The step's maximum so far: micro-batches (and an activation-checkpointing recompute, which changes nothing)
    each add theirs."""
    return new if recorded is None else torch.maximum(recorded, new)


@dataclass(frozen=True)
class QKClipUpdate:
    """p <- p * scale + shift along p's first dimension, for the parameter `param` (a name relative to the
    attention module) whose whole first dimension `scale` and `shift` span."""

    param: str
    scale: torch.Tensor
    shift: torch.Tensor | None = None


def per_head_rows(factors: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
    """Row factors of a projection whose output is, per head, blocks of rows: `factors` holds, per block, its
    [heads] factor and its width; e.g. [(sqrt(gamma), nope), (gamma, rope)]."""
    blocks = [factor[:, None].expand(-1, width) for factor, width in factors]
    return torch.cat(blocks, dim=1).flatten()


def linear_updates(name: str, linear: torch.nn.Linear, rows: torch.Tensor) -> list[QKClipUpdate]:
    """A linear layer's weight rows, and its bias with them (q = W x + b scales as a whole)."""
    updates = [QKClipUpdate(f"{name}.weight", rows)]
    if linear.bias is not None:
        updates.append(QKClipUpdate(f"{name}.bias", rows))
    return updates


def norm_updates(name: str, norm: torch.nn.Module, factor: torch.Tensor) -> list[QKClipUpdate]:
    """An RMSNorm's gain times `factor` (a scalar tensor): weight, or 1 + weight when zero-centred
    (1 + w' = factor (1 + w): w' = factor w + factor - 1)."""
    scale = factor.expand(norm.weight.shape[0])
    return [QKClipUpdate(f"{name}.weight", scale, scale - 1 if norm.zero_centered else None)]
