"""Shape of a Gated DeltaNet layer, Qwen3-Next's linear attention."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GatedDeltaNetArgs:
    """Field names follow the decoder's (dim, n_*_heads); the Hugging Face Qwen3NextConfig key each one comes
    from is named in its doc. Defaults are Qwen3-Next-80B-A3B's."""

    dim: int = 2048
    """Width of the residual stream (hidden_size)."""
    n_key_heads: int = 16
    """Query/key heads (linear_num_key_heads)."""
    n_value_heads: int = 32
    """Value heads (linear_num_value_heads), a multiple of n_key_heads: each key head serves
    n_value_heads // n_key_heads consecutive value heads, each with its own state, decay and write strength."""
    key_head_dim: int = 128
    """Width of a query/key head (linear_key_head_dim); the state of a value head is key_head_dim x value_head_dim."""
    value_head_dim: int = 128
    """Width of a value head (linear_value_head_dim)."""
    conv_kernel_size: int = 4
    """Taps of the causal depthwise convolution over q, k and v (linear_conv_kernel_dim)."""
    norm_eps: float = 1e-6
    """Epsilon of the gated RMSNorm on the output (rms_norm_eps)."""
    chunk_size: int = 64
    """Tokens per chunk of the chunked delta rule (a speed/memory trade-off; the result does not depend on it)."""

    def __post_init__(self) -> None:
        for name in ("dim", "n_key_heads", "n_value_heads", "key_head_dim", "value_head_dim", "conv_kernel_size",
                     "chunk_size"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"GatedDeltaNetArgs.{name}={getattr(self, name)} must be at least 1")
        if self.n_value_heads % self.n_key_heads:
            raise ValueError(
                f"GatedDeltaNetArgs.n_value_heads={self.n_value_heads} is not a multiple of "
                f"n_key_heads={self.n_key_heads}; each key head must serve a whole number of value heads"
            )

    @property
    def key_dim(self) -> int:
        return self.n_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.n_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: q, k and v side by side."""
        return 2 * self.key_dim + self.value_dim
