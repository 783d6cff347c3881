"""Hyena's position-mixing pieces: the short depthwise convolution, the implicit long filter, and the causal
FFT convolution that applies it.

Channel layout: the N + 1 projections of a channel are adjacent ([..., c * (N + 1) + g]) and so are its
N - 1 filters ([c * (N - 1) + i]). A contiguous shard of channels therefore holds whole channels, which
is what lets tensor parallelism split them (see plan.py); these modules then simply see fewer channels.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from titan_models.hyena.args import HyenaArgs
from titan_models.seeded_init import SeededInit, copy_full_

# A decay window falls to this fraction of its start at lag decay_fast/decay_slow * filter_len (safari).
_DECAY_TARGET = 1e-2


def fft_causal_conv(x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """y[..., c, t] = sum_{s <= t} h[c, t - s] * x[..., c, s]  for x [..., C, L] and h [C, >= L].

    One FFT of size 2L: the zero padding makes the circular convolution linear, hence causal. Computed in
    float32 at least (CPU FFTs have no bfloat16); the result keeps that dtype.
    """
    length = x.shape[-1]
    dtype = torch.promote_types(x.dtype, torch.float32)
    n = 2 * length
    x_f = torch.fft.rfft(x.to(dtype), n=n)
    h_f = torch.fft.rfft(h[..., :length].to(dtype), n=n)
    return torch.fft.irfft(x_f * h_f, n=n)[..., :length]


class ShortConv(nn.Module):
    """Causal depthwise convolution over the sequence with `kernel` taps: weight[c, kernel - 1] multiplies
    the current position, weight[c, 0] the oldest."""

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, kernel))
        self.bias = nn.Parameter(torch.empty(channels))

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """u [bs, seqlen, channels] -> [bs, channels, seqlen] (channels first, as the long convolution wants)."""
        weight, bias = self.weight, self.bias
        kernel = weight.shape[1]
        padded = F.pad(u.transpose(1, 2), (kernel - 1, 0))
        return F.conv1d(padded, weight.unsqueeze(1).to(u.dtype), bias.to(u.dtype), groups=weight.shape[0])

    def init_weights(self, init: SeededInit) -> None:
        # Unit gain: the sum over the taps keeps the projection's variance.
        init.trunc_normal_(self.weight, std=self.weight.shape[1] ** -0.5)
        nn.init.zeros_(self.bias)


class ImplicitFilter(nn.Module):
    """Long filters h[c, k] for lags k, as functions of the lag only (safari's HyenaFilter):

    positional features of k (a ramp k / filter_len and sin/cos of a few frequencies) -> an MLP with sine
    activations of learnable frequency -> one value per channel, times an exponential decay window whose
    rate goes from slow to fast across channels. `skip` is the per-channel D of y = h * v + D v.
    """

    def __init__(self, args: HyenaArgs, channels: int):
        super().__init__()
        self.filter_len = args.filter_len
        self.emb_dim = args.filter_emb_dim
        self.decay_fast, self.decay_slow = args.decay_fast, args.decay_slow
        self.sine_freq = args.filter_sine_freq
        width = args.filter_order
        self.pos = nn.Linear(args.filter_emb_dim, width)
        self.hidden = nn.ModuleList([nn.Linear(width, width) for _ in range(2)])
        self.freqs = nn.Parameter(torch.empty(3, width))  # one learnable frequency per sine activation
        self.out = nn.Linear(width, channels, bias=False)
        self.skip = nn.Parameter(torch.empty(channels))
        # Derived from args, recomputed by init_weights, never checkpointed.
        self.register_buffer("decay_rates", torch.empty(channels), persistent=False)

    def features(self, length: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """[length, emb_dim]: ramp, cos and -sin of (emb_dim - 1) / 2 frequencies, at lags 0..length-1."""
        bands = (self.emb_dim - 1) // 2
        lag = torch.arange(length, device=device, dtype=dtype)
        ramp = lag / self.filter_len
        angle = 2 * math.pi * lag / self.filter_len
        freqs = torch.linspace(1e-4, bands - 1, bands, device=device, dtype=dtype)
        phase = angle[:, None] * freqs[None, :]
        return torch.cat([ramp[:, None], torch.cos(phase), -torch.sin(phase)], dim=-1)

    def forward(self, length: int) -> torch.Tensor:
        """h [channels, length] in float32 (float64 for a float64 model), at lags 0..length-1."""
        out_weight = self.out.weight
        dtype = torch.promote_types(out_weight.dtype, torch.float32)
        z = self.features(length, out_weight.device, dtype)
        freqs = self.freqs.to(dtype)
        for k, linear in enumerate((self.pos, *self.hidden)):
            z = torch.sin(freqs[k] * F.linear(z, linear.weight.to(dtype), linear.bias.to(dtype)))
        h = F.linear(z, out_weight.to(dtype)).transpose(0, 1)
        ramp = torch.arange(length, device=h.device, dtype=dtype) / self.filter_len
        decay = torch.exp(-ramp[None, :] * self.decay_rates.to(dtype)[:, None])
        return h * decay

    def init_weights(self, init: SeededInit) -> None:
        for linear in (self.pos, *self.hidden):
            fan_in = linear.weight.shape[1]
            init.trunc_normal_(linear.weight, std=fan_in**-0.5)
            init.trunc_normal_(linear.bias, std=fan_in**-0.5)
        init.trunc_normal_(self.out.weight, std=self.out.weight.shape[1] ** -0.5)
        nn.init.constant_(self.freqs, self.sine_freq)
        init.normal_(self.skip, std=1.0)  # safari draws D from randn
        channels = self.decay_rates.shape[0]
        slow, fast = math.log(1 / _DECAY_TARGET) / self.decay_slow, math.log(1 / _DECAY_TARGET) / self.decay_fast
        copy_full_(self.decay_rates, torch.linspace(slow, fast, channels))
