"""Qwen3-MoE <-> Hugging Face Qwen3MoeForCausalLM: the decoder's tensor names (Llama's, q/k norms and experts
included), Qwen3-MoE's config.json and flavors."""

from __future__ import annotations

from titan_models.decoder.hf import DecoderHFAdapter
from titan_models.qwen3_moe.flavors import FLAVORS
from titan_models.qwen3_moe.hf_config import SPARSE, args_from_hf_config, hf_config


class Qwen3MoeHFAdapter(DecoderHFAdapter):
    architectures = (SPARSE,)
    flavors = FLAVORS
    family = "Qwen3-MoE"
    config_to_args = staticmethod(args_from_hf_config)
    args_to_config = staticmethod(hf_config)
