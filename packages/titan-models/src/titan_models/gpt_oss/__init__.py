"""GPT-OSS (OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card"): the decoder with attention sinks, a sliding window on
alternating layers, biased projections, YaRN RoPE, and sparse feed-forward layers with biased experts and a clamped
SwiGLU, declared as DecoderArgs data. The experts' MXFP4 weights of the published checkpoints are dequantized by
titan-checkpoint on import (hf_mxfp4.py)."""

from titan_models.gpt_oss.flavors import FLAVORS
from titan_models.gpt_oss.hf import GptOssHFAdapter
from titan_models.gpt_oss.hf_config import args_from_hf_config, hf_config
from titan_models.gpt_oss.plan import gpt_oss_plan, gpt_oss_tp_plan

__all__ = ["FLAVORS", "GptOssHFAdapter", "args_from_hf_config", "gpt_oss_plan", "gpt_oss_tp_plan", "hf_config"]
