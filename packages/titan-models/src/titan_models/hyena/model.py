"""A Hyena language model as a plain nn.Module: no parallelism here (see plan.py for how it is split).

The operator follows safari's HyenaOperator (Poli et al. 2023) and design/flash_inference.md; the blocks,
norms, MLP and init follow our Llama 3 so the two families train under the same recipe.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from titan_models.decoder.feed_forward import FeedForward
from titan_models.decoder.layers import RMSNorm
from titan_models.hyena.args import HyenaArgs
from titan_models.hyena.filter import ImplicitFilter, ShortConv, fft_causal_conv
from titan_models.seeded_init import SeededInit

LongConv = Callable[[int, torch.Tensor], torch.Tensor]
"""(filter index i, v [bs, channels, seqlen]) -> causal convolution of v with filter i, without the skip."""


class HyenaOperator(nn.Module):
    """Order-N Hyena: project to N + 1 streams, short causal conv, then N - 1 rounds of gate and long conv.

    x_0 .. x_{N-1}, v = split(short_conv(in_proj(u)))
    for i, x_j in enumerate(reversed(x_1 .. x_{N-1})):  v = h_i * (v . x_j) + D_i (v . x_j)
    out = out_proj(v . x_0)

    Order convention (safari's): order N means N gates x_0 .. x_{N-1} and N - 1 long convolutions, so the
    default N = 2 is one long convolution between two gates (x_1 before it, x_0 after it). Some texts count
    the long convolutions instead; their "order 2" is our order 3.

    Filter length scaling: h_i[k] depends on the lag k alone, through k / filter_len (positional features)
    and a decay window exp(-rate * k / filter_len) that reaches 1% at lag decay_fast * filter_len (fastest
    channel) to decay_slow * filter_len (slowest). The filters' reach is therefore set by filter_len, not by
    the sequence: past ~decay_slow * filter_len every channel's filter is effectively zero and the layer
    acts as a short convolution. To keep filters long at length L, set filter_len ~ L (flavor "debug_long"
    does it for 64k).
    """

    def __init__(self, args: HyenaArgs):
        super().__init__()
        self.order = args.order
        self.in_proj = nn.Linear(args.dim, (args.order + 1) * args.dim, bias=False)
        self.short_filter = ShortConv((args.order + 1) * args.dim, args.short_filter_len)
        self.filter = ImplicitFilter(args, args.n_filters * args.dim)
        self.out_proj = nn.Linear(args.dim, args.dim, bias=False)

    def split(self, u: torch.Tensor) -> list[torch.Tensor]:
        """[bs, (N+1) * channels, ...] -> N + 1 tensors [bs, channels, ...]: x_0, ..., x_{N-1}, v.

        -1 channels, not dim: under tensor parallelism this rank holds a slice of the channels."""
        return list(u.unflatten(1, (-1, self.order + 1)).unbind(2))

    def forward(self, x: torch.Tensor, long_conv: LongConv | None = None) -> torch.Tensor:
        """x [bs, seqlen, dim] -> [bs, seqlen, dim]. `long_conv` replaces the FFT convolution (generation's
        prefill records the convolution inputs through it)."""
        seqlen = x.shape[1]
        *gates, v = self.split(self.short_filter(self.in_proj(x)))
        n_filters = self.order - 1
        skip = self.filter.skip.view(-1, n_filters)
        h = None if long_conv is not None else self.filter(seqlen).view(-1, n_filters, seqlen)
        for i, gate in enumerate(reversed(gates[1:])):
            v = v * gate
            conv = long_conv(i, v) if long_conv is not None else fft_causal_conv(v, h[:, i])
            v = conv.to(v.dtype) + skip[:, i, None].to(v.dtype) * v
        return self.out_proj((v * gates[0]).transpose(1, 2))

    def init_weights(self, init: SeededInit, init_std: float) -> None:
        init.trunc_normal_(self.in_proj.weight, std=0.02)
        self.short_filter.init_weights(init)
        self.filter.init_weights(init)
        init.trunc_normal_(self.out_proj.weight, std=init_std)


class HyenaBlock(nn.Module):
    """Pre-norm residual block: Hyena mixer then SwiGLU."""

    def __init__(self, layer_id: int, args: HyenaArgs):
        super().__init__()
        self.mixer_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.mixer = HyenaOperator(args)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.hidden_dim)
        # Smaller std for the projections that write into the residual stream (as in Llama 3).
        if args.depth_init:
            self.weight_init_std = 0.02 / (2 * (layer_id + 1)) ** 0.5
        else:
            self.weight_init_std = 0.02 / (2 * args.n_layers) ** 0.5

    def forward(self, x: torch.Tensor, long_conv: LongConv | None = None) -> torch.Tensor:
        # long_conv by keyword: the tensor-parallel plan prepares the mixer's positional inputs only.
        h = x + self.mixer(self.mixer_norm(x), long_conv=long_conv)
        return h + self.feed_forward(self.ffn_norm(h))

    def init_weights(self, init: SeededInit) -> None:
        self.mixer_norm.reset_parameters()
        self.ffn_norm.reset_parameters()
        self.mixer.init_weights(init, self.weight_init_std)
        self.feed_forward.init_weights(init, self.weight_init_std)


class HyenaLM(nn.Module):
    """token embedding -> n_layers x HyenaBlock -> RMSNorm -> LM head.

    Pipeline stages delete what they do not own: entries of `layers` (a ModuleDict keyed "0".."n-1") and
    `tok_embeddings` / `norm` / `output` set to None. Without tok_embeddings the input is already hidden
    states; without output the result is.
    """

    def __init__(self, args: HyenaArgs):
        super().__init__()
        args.validate()
        self.args = args
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): HyenaBlock(i, args) for i in range(args.n_layers)})
        self.norm: RMSNorm | None = RMSNorm(args.dim, eps=args.norm_eps)
        self.output: nn.Linear | None = nn.Linear(args.dim, args.vocab_size, bias=False)

    def init_weights(self, buffer_device: torch.device | str | None = None, seed: int | None = None) -> None:
        """Initialize every parameter and buffer this (possibly partial) model holds; call after to_empty().

        Each parameter is drawn from a generator seeded by (seed, its name) -- see titan_models.seeded_init
        -- so the weights depend only on the seed and the device type, never on the parallel layout. seed
        defaults to torch.initial_seed(). Buffers (the filters' decay rates) are computed where they live;
        buffer_device is accepted for the trainer's interface.
        """
        del buffer_device  # buffers are filled in place on their own device (to_empty put them there)
        init = SeededInit(self, torch.initial_seed() if seed is None else seed)
        if self.tok_embeddings is not None:
            init.normal_(self.tok_embeddings.weight, std=1.0)
        for layer in self.layers.values():
            layer.init_weights(init)
        if self.norm is not None:
            self.norm.reset_parameters()
        if self.output is not None:
            std = self.args.dim**-0.5
            init.trunc_normal_(self.output.weight, std=std, a=-3 * std, b=3 * std)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """tokens: [bs, seqlen] ids, or [bs, seqlen, dim] hidden states when tok_embeddings is None.

        positions: accepted for the trainer's interface; they must be 0..seqlen-1 (or None): the long
        convolutions run over the sequence as given, so a slice of it (context parallelism) is refused.
        Returns logits [bs, seqlen, vocab_size], or hidden states when output is None.
        """
        if positions is not None:
            _check_whole_sequence(positions, tokens.shape[1])
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def _check_whole_sequence(positions: torch.Tensor, seqlen: int) -> None:
    expected = torch.arange(seqlen, device=positions.device)
    if positions.shape[-1] != seqlen or not bool((positions == expected).all()):
        raise ValueError(
            "HyenaLM got positions other than 0..seqlen-1: Hyena's long convolutions need the whole sequence "
            "on each rank, so context parallelism is not supported; use parallelism.context_parallel_degree=1"
        )
