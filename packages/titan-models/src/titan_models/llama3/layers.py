"""The decoder's shared layers moved to titan_models.decoder.layers in 0.16; this path is kept until 0.18."""

from titan_models.decoder.layers import RMSNorm, ScaledDotProductAttention, block_causal_mask

__all__ = ["RMSNorm", "ScaledDotProductAttention", "block_causal_mask"]
