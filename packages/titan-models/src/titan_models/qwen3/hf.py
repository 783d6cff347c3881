"""Qwen3 / Qwen3-MoE <-> Hugging Face: Llama's tensor names (q/k norms and experts included), their own
config.json and flavors."""

from __future__ import annotations

from titan_models.llama3.hf import Llama3HFAdapter
from titan_models.qwen3.flavors import FLAVORS, MOE_FLAVORS
from titan_models.qwen3.hf_config import DENSE, SPARSE, args_from_hf_config, hf_config


class Qwen3HFAdapter(Llama3HFAdapter):
    architectures = (DENSE,)
    flavors = FLAVORS
    family = "Qwen3"
    config_to_args = staticmethod(args_from_hf_config)
    args_to_config = staticmethod(hf_config)


class Qwen3MoeHFAdapter(Qwen3HFAdapter):
    architectures = (SPARSE,)
    flavors = MOE_FLAVORS
    family = "Qwen3-MoE"
