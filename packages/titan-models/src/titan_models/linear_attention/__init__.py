"""Linear attention: Gated DeltaNet (Yang et al., 2024), the token mixer of Qwen3-Next's linear-attention layers."""

from titan_models.linear_attention.args import GatedDeltaNetArgs
from titan_models.linear_attention.gated_delta_rule import chunk_gated_delta_rule, recurrent_gated_delta_rule
from titan_models.linear_attention.gated_deltanet import GatedDeltaNet, GatedDeltaNetCache

__all__ = [
    "GatedDeltaNet",
    "GatedDeltaNetArgs",
    "GatedDeltaNetCache",
    "chunk_gated_delta_rule",
    "recurrent_gated_delta_rule",
]
