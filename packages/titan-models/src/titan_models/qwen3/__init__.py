"""Qwen3 and Qwen3-MoE (Qwen team, "Qwen3 Technical Report"): Llama 3's decoder with per-head q/k RMSNorm,
a head width of its own, and (MoE) sparse feed-forward layers, declared as Llama3Args data."""

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
