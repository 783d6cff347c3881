"""Llama 3 <-> Hugging Face LlamaForCausalLM: the decoder's mapping (titan_models.decoder.hf) with Llama's
architecture, flavors and config.json (hf_config.py).

Tied embeddings (Llama 3.2 1B / 3B) and the rotary permutation of wq / wk are the decoder mapping's.
titan-checkpoint finds this adapter through the "titan.hf_adapters" entry point, never by import.
"""

from __future__ import annotations

from titan_models.decoder.hf import DecoderHFAdapter
from titan_models.llama3.flavors import FLAVORS
from titan_models.llama3.hf_config import ARCHITECTURE, args_from_hf_config, hf_config


class Llama3HFAdapter(DecoderHFAdapter):
    architectures = (ARCHITECTURE,)
    flavors = FLAVORS
    family = "Llama 3"
    config_to_args = staticmethod(args_from_hf_config)
    args_to_config = staticmethod(hf_config)
