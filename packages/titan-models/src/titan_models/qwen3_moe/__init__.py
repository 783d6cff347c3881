"""Qwen3-MoE (Qwen team, "Qwen3 Technical Report"): Qwen3's decoder with sparse feed-forward layers (softmax
routing, no shared experts), declared as DecoderArgs data."""

from titan_models.qwen3_moe.flavors import FLAVORS
from titan_models.qwen3_moe.hf import Qwen3MoeHFAdapter
from titan_models.qwen3_moe.hf_config import args_from_hf_config, hf_config
from titan_models.qwen3_moe.plan import qwen3_moe_plan, qwen3_moe_tp_plan

__all__ = ["FLAVORS", "Qwen3MoeHFAdapter", "args_from_hf_config", "hf_config", "qwen3_moe_plan", "qwen3_moe_tp_plan"]
