"""Qwen3 <-> Hugging Face Qwen3ForCausalLM: the decoder's tensor names (Llama's, q/k norms included), Qwen3's
config.json and flavors."""

from __future__ import annotations

from titan_models.decoder.hf import DecoderHFAdapter
from titan_models.qwen3.flavors import FLAVORS
from titan_models.qwen3.hf_config import DENSE, args_from_hf_config, hf_config


class Qwen3HFAdapter(DecoderHFAdapter):
    architectures = (DENSE,)
    flavors = FLAVORS
    family = "Qwen3"
    config_to_args = staticmethod(args_from_hf_config)
    args_to_config = staticmethod(hf_config)
