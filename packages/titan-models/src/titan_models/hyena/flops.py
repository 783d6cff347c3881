"""Parameter counts and training FLOPs per token, for MFU."""

from __future__ import annotations

import math

from titan_models.hyena.args import HyenaArgs


def count_params(args: HyenaArgs, exclude_embedding: bool = True) -> int:
    """Parameters of HyenaLM(args), from the shapes alone (the token embedding excluded by default)."""
    d, width, emb = args.dim, args.filter_order, args.filter_emb_dim
    projections = (args.order + 1) * d * d + d * d
    short_conv = (args.order + 1) * d * (args.short_filter_len + 1)
    filter_channels = args.n_filters * d
    implicit_filter = (emb + 1) * width + 2 * (width + 1) * width + 3 * width + width * filter_channels
    implicit_filter += filter_channels  # the skip D
    feed_forward = 3 * d * args.hidden_dim
    norms = 2 * d
    block = projections + short_conv + implicit_filter + feed_forward + norms
    total = args.n_layers * block + d + args.vocab_size * d
    if not exclude_embedding:
        total += args.vocab_size * d
    return total


def fft_conv_flops(seq_len: int) -> float:
    """Forward FLOPs of one channel's causal FFT convolution over seq_len positions, per position.

    Three real FFTs of size n = 2 * seq_len (input, filter, inverse), each ~2.5 n log2 n FLOPs (the usual
    5 n log2 n for a complex FFT, halved for real input), plus the complex product of n / 2 + 1 bins at
    6 FLOPs each; divided by seq_len.
    """
    n = 2 * seq_len
    return (3 * 2.5 * n * math.log2(n) + 6 * (n // 2 + 1)) / seq_len


def flops_per_token(args: HyenaArgs, seq_len: int) -> int:
    """Training FLOPs per token: 6 * N + 3 * n_layers * (order - 1) * dim * fft_conv_flops(seq_len).

    6 * N (N = non-embedding parameters): one multiply-add per weight per token forward, two backward.
    The implicit filters run once per position per batch rather than once per token, so counting their
    parameters in 6 N overstates them (they are 0.6% of N for 125M, 1.1% for debug). The second term is
    the long convolutions, which have no parameters: per layer, (order - 1) * dim channels each take an
    FFT convolution forward and two in backward (gradients for the input and for the filter), ~15 log2(2 L)
    + 6 FLOPs per position each. Gating and the short convolution's elementwise products are ignored, like
    norms.
    """
    conv = 3 * args.n_layers * args.n_filters * args.dim * fft_conv_flops(seq_len)
    return int(6 * count_params(args) + conv)
