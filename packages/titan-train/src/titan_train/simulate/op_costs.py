"""FLOPs and communication of Titan's opaque ops, which the op trace sees as one op each (custom ops whose
fake implementation only shapes their outputs): what the step-time model needs of them, from their arguments.

Ring attention (titan_parallel/cp/ring_attention.py): each rank's queries attend over the whole sequence
(its local length times the ring's size), causal in the load-balanced split that gives every rank the same
half; the K/V blocks travel the ring once forward, and once more backward with their float32 gradient
accumulators, each hop overlapped with a block's compute. With a sliding window a rank computes only the
sub-blocks ring_attention.sub_blocks keeps -- (query chunk, key chunk) pairs with a key inside some query's window,
whole (fused kernel) where the window leaves them whole, else the band it leaves, in tiles of `window` queries
(masked math kernel, every score of a tile counted); the ring's busiest rank is counted, as the step waits for it.
The K/V blocks still travel the whole ring.

FlexAttention (flex_stand_in.py): the fused kernel over the pairs a query sees -- its causal past, or the
window's keys -- counted pair by pair (as the causal kernels' halving is), block granularity aside.
"""

from __future__ import annotations

from titan_debug import Collective, attention_flops, group_ranks
from titan_train.simulate.solve_costs import triangular_solve_cost


def visible_keys_per_query(length: int, window: int | None) -> float:
    """Mean keys a query of a causal sequence of `length` sees, itself included (window None: its whole past):
    sum over positions p of min(p + 1, window), over length. Without a window, length / 2 -- the causal halving
    attention_flops applies -- rather than (length + 1) / 2."""
    if window is None or window >= length:
        return length / 2
    return window - window * (window - 1) / (2 * length)


def _flex_attention(bound: dict, backward: bool) -> tuple[int, None]:
    q, window, causal = bound["q"], bound["window"], bool(bound["causal"])
    length = bound["k"].shape[-2]
    if not causal:
        return attention_flops(q, length, False, backward), None
    keys = visible_keys_per_query(length, window)
    return round(attention_flops(q, length, False, backward) * keys / length), None


def _length(part: slice, local: int) -> int:
    start, stop, _ = part.indices(local)
    return stop - start


def windowed_ring_flops(q, rank: int, ring: int, causal: bool, window: int, backward: bool) -> int:
    """What `rank` of a ring of `ring` ranks computes of windowed ring attention over its local queries `q`
    [..., S_local, D]: the sub-blocks ring_attention.sub_blocks keeps, every score of each computed."""
    from titan_parallel.cp.ring_attention import sub_blocks

    local = q.shape[-2]
    flops = 0
    for source in range(ring):
        for block in sub_blocks(rank, source, ring, causal, local, window):
            rows, cols = _length(block.rows, local), _length(block.cols, local)
            fused_causal = block.causal and block.window_origin is None
            flops += attention_flops(q[..., :rows, :], cols, fused_causal, backward)
    return flops


def _ring_attention(bound: dict, backward: bool) -> tuple[int, Collective | None]:
    ranks = group_ranks(bound)
    ring = max(len(ranks), 1)
    q, k, v = bound["q"], bound["k"], bound["v"]
    causal, window = bool(bound["causal"]), bound.get("window")
    if window is None:
        flops = attention_flops(q, k.shape[-2] * ring, causal, backward)
    else:
        flops = max(windowed_ring_flops(q, rank, ring, causal, window, backward) for rank in range(ring))
    block = k.numel() * k.element_size() + v.numel() * v.element_size()
    if backward:
        block += (k.numel() + v.numel()) * 4
    return flops, Collective("all_gather", ring * block, ranks) if ring > 1 else None


OPAQUE_OP_COSTS = {
    "titan.ring_attention": lambda bound: _ring_attention(bound, backward=False),
    "titan.ring_attention_backward": lambda bound: _ring_attention(bound, backward=True),
    "titan.flex_attention_stand_in": lambda bound: _flex_attention(bound, backward=False),
    "titan.flex_attention_stand_in_backward": lambda bound: _flex_attention(bound, backward=True),
    # Not opaque, but a matmul-like op op_trace does not count (Qwen3-Next's delta rule; solve_costs.py).
    "aten.linalg_solve_triangular": triangular_solve_cost,
}
