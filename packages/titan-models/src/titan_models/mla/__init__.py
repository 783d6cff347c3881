"""Multi-head latent attention (DeepSeek-V2 / V3): keys and values through a low-rank latent. The module
itself is `titan_models.mla.attention.MultiHeadLatentAttention`, which the decoder builds from its args."""

from titan_models.mla.args import MLAArgs

__all__ = ["MLAArgs"]
