"""Qwen3 (Qwen team, "Qwen3 Technical Report"): the decoder with per-head q/k RMSNorm and a head width of its own,
declared as DecoderArgs data. Qwen3-MoE is titan_models.qwen3_moe."""

from titan_models.qwen3.flavors import FLAVORS
from titan_models.qwen3.hf import Qwen3HFAdapter
from titan_models.qwen3.hf_config import args_from_hf_config, hf_config
from titan_models.qwen3.plan import qwen3_plan

__all__ = [
    "FLAVORS",
    "Qwen3HFAdapter",
    "args_from_hf_config",
    "hf_config",
    "qwen3_plan",
]
