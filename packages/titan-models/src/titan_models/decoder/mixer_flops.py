"""Training FLOPs of the token mixing that has no parameters in a Gated DeltaNet layer (Qwen3-Next's linear
attention): the chunked gated delta rule (titan_models/linear_attention/gated_delta_rule.py), which flops.py adds
beside softmax attention's scores and weighted values. Its projections and short convolution are weights a token
multiplies once each (the depthwise convolution: conv_dim * conv_kernel_size multiply-adds per token, one per
weight), so 6 * N counts them already."""

from __future__ import annotations

from titan_models.linear_attention.args import GatedDeltaNetArgs


def delta_rule_forward_flops_per_chunk(args: GatedDeltaNetArgs) -> int:
    """Forward FLOPs of one value head over one chunk of C = args.chunk_size tokens, as chunk_gated_delta_rule
    computes them (2 FLOPs a multiply-add; key heads are repeated to value heads before the rule, so every value
    head computes its own; d_k, d_v the key and value head widths):

    - inside the chunk, dense C x C products (masked after, so all C^2 are computed): the system
      (beta k) k^T and the scores q k^T, 2 C^2 d_k each;
    - the two unit lower-triangular solves (the WY / UT transform) for the corrections if the state were zero
      (right-hand side beta v, d_v columns) and for how the state enters them (beta k, d_k columns): C (C - 1)
      / 2 multiply-adds a column, C (C - 1) (d_k + d_v) together;
    - with the state S [d_k, d_v]: reading it for the corrections and for the outputs (C x d_k times S, 2 C d_k d_v
      each), the scores times the corrections (2 C^2 d_v), and the state update k^T corrections (2 C d_k d_v).
    """
    c, d_k, d_v = args.chunk_size, args.key_head_dim, args.value_head_dim
    intra_chunk = 2 * (2 * c * c * d_k) + 2 * c * c * d_v
    triangular_solves = c * (c - 1) * (d_k + d_v)
    state = 3 * (2 * c * d_k * d_v)
    return intra_chunk + triangular_solves + state


def delta_rule_flops_per_token(args: GatedDeltaNetArgs, seq_len: int) -> int:
    """Training FLOPs per token of one layer's gated delta rule: the forward of every value head over the
    sequence's chunks (padded to a whole chunk, as the rule pads), times 3 for forward + backward as flops.py
    counts every term, over seq_len tokens (rounded down when seq_len is not a whole number of chunks)."""
    chunks = -(-seq_len // args.chunk_size)
    return 3 * args.n_value_heads * chunks * delta_rule_forward_flops_per_chunk(args) // seq_len
