"""Qwen3-Next (Qwen team, "Qwen3-Next"): the decoder with three Gated DeltaNet (linear-attention) layers per
gated-attention layer, partial RoPE, zero-centred RMSNorms and sparse layers with a sigmoid-gated shared expert,
declared as DecoderArgs data (titan_models.decoder) with the Gated DeltaNet of titan_models.linear_attention."""

from titan_models.qwen3_next.flavors import FLAVORS
from titan_models.qwen3_next.hf import Qwen3NextHFAdapter
from titan_models.qwen3_next.hf_config import args_from_hf_config, hf_config
from titan_models.qwen3_next.plan import qwen3_next_plan

__all__ = ["FLAVORS", "Qwen3NextHFAdapter", "args_from_hf_config", "hf_config", "qwen3_next_plan"]
