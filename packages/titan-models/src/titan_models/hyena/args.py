"""Hyena hyperparameters: one dataclass, validated before any module is built."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class HyenaArgs:
    """Shape of a Hyena language model (Poli et al., "Hyena Hierarchy", 2023; safari's HyenaOperator)."""

    dim: int = 768
    """Width of the residual stream, and the number of channels of each Hyena projection."""
    n_layers: int = 12
    """Number of blocks (Hyena mixer + MLP)."""
    vocab_size: int = 50304
    """Rows of the token embedding and of the output projection."""
    order: int = 2
    """Hyena order N: N + 1 projections (gates x_0..x_{N-1} and the value v) and N - 1 long convolutions."""
    short_filter_len: int = 3
    """Taps of the causal depthwise convolution applied to the projections (1: no history, a per-channel
    scale and bias)."""
    filter_emb_dim: int = 33
    """Positional features fed to the implicit filter: a ramp plus (filter_emb_dim - 1) / 2 sin/cos pairs (odd)."""
    filter_order: int = 64
    """Width of the implicit filter's sine-activated MLP."""
    filter_sine_freq: float = 1.0
    """Initial frequency of the filter MLP's sine activations (learnable)."""
    filter_len: int = 2048
    """Length that filter positions are normalized by: lag k has features of k / filter_len. A filter value
    depends on the lag only, never on the sequence length, so training and generation see the same filter
    at any length (lags past filter_len extrapolate the same smooth functions)."""
    decay_fast: float = 0.3
    """Fastest decay window: the channel's filter falls to 1% at lag decay_fast * filter_len."""
    decay_slow: float = 1.5
    """Slowest decay window: the channel's filter falls to 1% at lag decay_slow * filter_len."""
    multiple_of: int = 256
    """The SwiGLU hidden size is rounded up to a multiple of this."""
    ffn_dim_multiplier: float | None = None
    """Scales the SwiGLU hidden size int(8 * dim / 3) before rounding; None means 1."""
    norm_eps: float = 1e-5
    """Epsilon inside RMSNorm."""
    max_seq_len: int = 2048
    """Longest sequence the trainer feeds (it raises this to training.seq_len). Hyena has no position table,
    so nothing is sized by it; generation materializes filters for the length it needs."""
    depth_init: bool = True
    """If True the output projections of block i use std 0.02 / sqrt(2 * (i + 1)); if False every block
    uses 0.02 / sqrt(2 * n_layers)."""

    @property
    def hidden_dim(self) -> int:
        """SwiGLU hidden size, as in Llama 3 (8 * dim / 3, rounded up to multiple_of)."""
        hidden = int(2 * (4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    @property
    def n_filters(self) -> int:
        """Long convolutions per block (order - 1), each over dim channels."""
        return self.order - 1

    def validate(self) -> None:
        """Raise ValueError naming the first field that cannot build a model."""
        positive = ("dim", "n_layers", "vocab_size", "short_filter_len", "filter_emb_dim", "filter_order")
        for name in (*positive, "filter_len", "multiple_of", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"HyenaArgs.{name}={value!r} must be a positive integer")
        if not isinstance(self.order, int) or self.order < 2:
            raise ValueError(f"HyenaArgs.order={self.order!r} must be an integer >= 2 (2 is Hyena's default)")
        if self.filter_emb_dim < 3 or self.filter_emb_dim % 2 == 0:
            raise ValueError(
                f"HyenaArgs.filter_emb_dim={self.filter_emb_dim} must be odd and >= 3 (a ramp plus sin/cos pairs)"
            )
        if not 0 < self.decay_fast <= self.decay_slow:
            raise ValueError(
                f"HyenaArgs: need 0 < decay_fast <= decay_slow, got decay_fast={self.decay_fast}, "
                f"decay_slow={self.decay_slow}"
            )
        if self.ffn_dim_multiplier is not None and not self.ffn_dim_multiplier > 0:
            raise ValueError(f"HyenaArgs.ffn_dim_multiplier={self.ffn_dim_multiplier!r} must be > 0 or None")
        if not self.norm_eps > 0:
            raise ValueError(f"HyenaArgs.norm_eps={self.norm_eps!r} must be > 0")
