"""Rotary embeddings moved to titan_models.decoder.rope in 0.16; this path is kept until 0.18."""

from titan_models.decoder.rope import (
    RopeScaling,
    YarnScaling,
    apply_rotary_emb,
    precompute_freqs_cis,
    rotation_magnitude,
    scale_frequencies,
    softmax_scale_factor,
    yarn_frequencies,
)

__all__ = [
    "RopeScaling",
    "YarnScaling",
    "apply_rotary_emb",
    "precompute_freqs_cis",
    "rotation_magnitude",
    "scale_frequencies",
    "softmax_scale_factor",
    "yarn_frequencies",
]
