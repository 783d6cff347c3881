"""Shape of multi-head latent attention, as data a decoder's args carry."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MLAArgs:
    """DeepSeek-V2 / V3's attention (DeepSeek-V2 paper, section 2.1): keys and values are computed from one
    `kv_lora_rank` latent per token (what a KV cache would keep), queries optionally from a `q_lora_rank`
    latent; each query / key head is a non-rotary part and a rotary part, the rotary key shared by all heads.
    Field names follow Hugging Face's DeepseekV3Config."""

    kv_lora_rank: int = 512
    """Width of the key/value latent."""
    q_lora_rank: int | None = None
    """Width of the query latent; None: queries are projected from the hidden state directly."""
    qk_nope_head_dim: int = 128
    """Per-head query/key width without position information."""
    qk_rope_head_dim: int = 64
    """Per-head query/key width rotated by RoPE (one rotary key for all heads)."""
    v_head_dim: int = 128
    """Per-head value width (need not equal the query/key width)."""

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def validate(self, owner: str = "MLAArgs") -> None:
        """Raise ValueError naming the first field that cannot build the layer."""
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{owner}.{name}={value!r} must be a positive integer")
        if self.q_lora_rank is not None and (not isinstance(self.q_lora_rank, int) or self.q_lora_rank <= 0):
            raise ValueError(f"{owner}.q_lora_rank={self.q_lora_rank!r} must be a positive integer or None")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"{owner}.qk_rope_head_dim={self.qk_rope_head_dim} must be even: RoPE rotates pairs")
