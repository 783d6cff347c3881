"""FLOPs and communication of Titan's opaque ops, which the op trace sees as one op each (custom ops whose
fake implementation only shapes their outputs): what the step-time model needs of them, from their arguments.

Ring attention (titan_parallel/cp/ring_attention.py): each rank's queries attend over the whole sequence
(its local length times the ring's size), causal in the load-balanced split that gives every rank the same
half; the K/V blocks travel the ring once forward, and once more backward with their float32 gradient
accumulators, each hop overlapped with a block's compute.
"""

from __future__ import annotations

from titan_debug import Collective, attention_flops, group_ranks


def _ring_attention(bound: dict, backward: bool) -> tuple[int, Collective | None]:
    ranks = group_ranks(bound)
    ring = max(len(ranks), 1)
    q, k, v = bound["q"], bound["k"], bound["v"]
    flops = attention_flops(q, k.shape[-2] * ring, bool(bound["causal"]), backward)
    block = k.numel() * k.element_size() + v.numel() * v.element_size()
    if backward:
        block += (k.numel() + v.numel()) * 4
    return flops, Collective("all_gather", ring * block, ranks) if ring > 1 else None


OPAQUE_OP_COSTS = {
    "titan.ring_attention": lambda bound: _ring_attention(bound, backward=False),
    "titan.ring_attention_backward": lambda bound: _ring_attention(bound, backward=True),
}
