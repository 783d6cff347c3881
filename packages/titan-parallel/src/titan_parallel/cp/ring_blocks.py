"""Ring attention's blocks: which query/key pairs of the block each source rank holds this rank computes, and
the mask of each computed piece.

Causal attention needs the load-balanced layout of `shard_sequence` (context_parallel.py): rank i holds
chunks i and 2*cp-1-i of 2*cp equal chunks, so every rank does the same work. For the block of rank j seen
from rank i, chunk by chunk the masks are full, diagonal or skipped, which leaves three shapes:
  j == i   both local chunks against both, causal (the local order is already the global order);
  j < i    all queries against j's first chunk only, no mask (j's second chunk is later than both of ours);
  j > i    our second chunk only against both of j's chunks, no mask (our first chunk is before both).

Packed documents (block-causal attention, `document_ids`): every rank's document ids [B, S_local] are
gathered once (a few integers per token), so each block also masks query/key pairs of different documents
on top of the shapes above, and a block where no pair shares a document is skipped in forward and backward
(its K/V still travel on). The split stays the load-balanced one. Masked blocks run the math kernel (the
fused kernels take no mask).

A sliding window (`window`: a query sees itself and the window - 1 keys before it, GPT-OSS's local layers) works
chunk by chunk: every (query chunk, key chunk) pair of a block is skipped when no key of it lies in any query's
window (nothing computed, forward or backward), computed with the fused kernel when the window hides none of its
pairs, and where the window cuts through, only the band it leaves is computed, in tiles of `window` queries against
the keys they can see (masked, math kernel): a rank's work is then ~ its queries x 2 window, not x the sequence.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


def _block_slices(rank: int, source: int, causal: bool, length: int) -> tuple[slice, slice, bool]:
    """(query rows, key rows, causal) of the block of `source` as seen from `rank` (see the module docstring)."""
    every, half = slice(None), length // 2
    if not causal:
        return every, every, False
    if source == rank:
        return every, every, True
    if source < rank:
        return every, slice(0, half), False
    return slice(half, None), every, False


class SubBlock(NamedTuple):
    """A piece of one block that is computed: query rows and key rows of the local tensors, causal (a diagonal
    chunk pair, fused kernel), and, where the window cuts through it, the global positions of its first query and
    first key (its mask is built from them)."""

    rows: slice
    cols: slice
    causal: bool
    window_origin: tuple[int, int] | None


def sub_blocks(rank: int, source: int, cp: int, causal: bool, length: int, window: int | None) -> list[SubBlock]:
    """What `rank` computes of the block `source` holds: the block's shape (`_block_slices`) without a window.
    With one, per (query chunk, key chunk) pair: nothing when no key lies inside any query's window; the whole
    pair when the window hides none of its pairs; else the band the window leaves, in tiles of `window` queries,
    each against the keys its queries can see (window_tiles). Chunk c of 2 * cp holds positions
    [c * half, (c + 1) * half); rank r holds chunks r and 2 * cp - 1 - r."""
    if window is None:
        return [SubBlock(*_block_slices(rank, source, causal, length), None)]
    half = length // 2
    mine = [(0, rank), (half, 2 * cp - 1 - rank)]  # (local offset, chunk)
    theirs = [(0, source), (half, 2 * cp - 1 - source)]
    pieces = []
    for q_offset, q_chunk in mine:
        for k_offset, k_chunk in theirs:
            if k_chunk > q_chunk:
                continue  # every key after every query
            nearest = 0 if k_chunk == q_chunk else (q_chunk - k_chunk - 1) * half + 1
            farthest = (q_chunk - k_chunk + 1) * half - 1
            if nearest >= window:
                continue  # every key outside every query's window: skipped
            if farthest < window:
                rows, cols = slice(q_offset, q_offset + half), slice(k_offset, k_offset + half)
                pieces.append(SubBlock(rows, cols, k_chunk == q_chunk, None))
                continue
            pieces += window_tiles(q_offset, q_chunk * half, k_offset, k_chunk * half, half, window)
    return pieces


def window_tiles(q_offset: int, q_start: int, k_offset: int, k_start: int, length: int, window: int) -> list[SubBlock]:
    """The band a window leaves of a chunk pair (local offsets, global starts, `length` positions each): query
    tiles of `window` rows, each against the keys from window - 1 before its first query to its last query, so a
    tile computes at most window x (2 window - 1) scores for its ~window x window visible ones, not the chunk's."""
    tiles = []
    for first in range(0, length, window):
        last = min(first + window, length) - 1
        first_key = max(q_start + first - window + 1, k_start)
        last_key = min(q_start + last, k_start + length - 1)
        if last_key < first_key:
            continue  # these queries see no key of the chunk
        rows = slice(q_offset + first, q_offset + last + 1)
        cols = slice(k_offset + first_key - k_start, k_offset + last_key - k_start + 1)
        tiles.append(SubBlock(rows, cols, False, (q_start + first, first_key)))
    return tiles


def block_mask(documents, window: int | None, rank: int, source: int, block: SubBlock, device: torch.device):
    """Bool [B or 1, Sq, Sk] for the sub-block (True: may attend), None when nothing but its causal shape masks
    it, or False when no query/key pair of it shares a document (the block is skipped)."""
    rows, cols = block.rows, block.cols
    mask = None
    if documents is not None:
        mask = documents[rank][:, rows].unsqueeze(-1) == documents[source][:, cols].unsqueeze(-2)
    if block.window_origin is not None:
        # A window's tile has explicit bounds (window_tiles); its mask is causality and the window together.
        q_origin, k_origin = block.window_origin
        q_pos = q_origin + torch.arange(rows.stop - rows.start, device=device)
        k_pos = k_origin + torch.arange(cols.stop - cols.start, device=device)
        distance = q_pos[:, None] - k_pos[None, :]
        in_window = ((distance >= 0) & (distance < window)).unsqueeze(0)
        mask = in_window if mask is None else mask & in_window
    if mask is None:
        return None
    if block.causal:
        mask = mask & torch.ones(mask.shape[-2:], dtype=torch.bool, device=mask.device).tril()
    if documents is None:
        return mask  # a window's tile always holds a visible pair
    return mask if bool(mask.any()) else False
