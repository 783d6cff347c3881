"""Llama 3 is the decoder (titan_models.decoder.model.Decoder), built from Llama 3's args. The decoder's parts
lived here before 0.16; these names are kept until 0.18."""

from titan_models.decoder.attention import Attention, repeat_kv
from titan_models.decoder.block import TransformerBlock
from titan_models.decoder.feed_forward import FeedForward, SharedExperts
from titan_models.decoder.layers import RMSNorm, ScaledDotProductAttention, block_causal_mask
from titan_models.decoder.model import Decoder

Llama3 = Decoder
"""Llama 3's name for the decoder."""

Transformer = Decoder
"""The name of `Llama3` before 0.2; kept so existing imports work."""

__all__ = [
    "Attention",
    "FeedForward",
    "Llama3",
    "RMSNorm",
    "ScaledDotProductAttention",
    "SharedExperts",
    "Transformer",
    "TransformerBlock",
    "block_causal_mask",
    "repeat_kv",
]
