"""Qwen3 (Qwen team, "Qwen3 Technical Report"): the decoder with per-head q/k RMSNorm and a head width of its own,
declared as DecoderArgs data. Qwen3-MoE is titan_models.qwen3_moe; its names here (MOE_FLAVORS,
Qwen3MoeHFAdapter) are kept until 0.18."""

from titan_models.qwen3.flavors import FLAVORS, MOE_FLAVORS
from titan_models.qwen3.hf import Qwen3HFAdapter, Qwen3MoeHFAdapter
from titan_models.qwen3.hf_config import args_from_hf_config, hf_config
from titan_models.qwen3.plan import qwen3_plan

__all__ = [
    "FLAVORS",
    "MOE_FLAVORS",
    "Qwen3HFAdapter",
    "Qwen3MoeHFAdapter",
    "args_from_hf_config",
    "hf_config",
    "qwen3_plan",
]
