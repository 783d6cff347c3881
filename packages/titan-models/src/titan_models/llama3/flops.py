"""The decoder's parameter counts and FLOPs moved to titan_models.decoder.flops in 0.16; this path is kept
until 0.18."""

from titan_models.decoder.flops import count_params, flops_per_token, num_params

__all__ = ["count_params", "flops_per_token", "num_params"]
