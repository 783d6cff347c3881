"""Llama 3 / 3.1 (Meta, "The Llama 3 Herd of Models"), TorchTitan's layout: the decoder (titan_models.decoder)
with Llama 3's flavors, Hugging Face mapping and plan."""

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.flops import count_params, flops_per_token, num_params
from titan_models.decoder.model import Decoder
from titan_models.decoder.rope import RopeScaling, YarnScaling
from titan_models.llama3.flavors import FLAVORS
from titan_models.llama3.hf import Llama3HFAdapter, args_from_hf_config, hf_config
from titan_models.llama3.plan import llama3_plan, llama3_tp_plan

Llama3 = Decoder
"""Llama 3's name for the decoder."""

Transformer = Decoder
"""The name of `Llama3` before 0.2; kept so existing imports work."""

Llama3Args = DecoderArgs
"""Llama 3's name for the decoder's args, the name flavor tables and checkpoints' configs use."""

__all__ = [
    "FLAVORS",
    "Llama3Args",
    "Llama3HFAdapter",
    "RopeScaling",
    "Transformer",
    "YarnScaling",
    "Llama3",
    "args_from_hf_config",
    "count_params",
    "flops_per_token",
    "hf_config",
    "llama3_plan",
    "llama3_tp_plan",
    "num_params",
]
