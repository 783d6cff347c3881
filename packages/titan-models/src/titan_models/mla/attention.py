"""Moved to titan_models.decoder.mla in 0.16; this path is kept until 0.18."""

from titan_models.decoder.mla import LATENT_NORM_EPS, MultiHeadLatentAttention

__all__ = ["LATENT_NORM_EPS", "MultiHeadLatentAttention"]
