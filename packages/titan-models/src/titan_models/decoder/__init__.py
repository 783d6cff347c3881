"""The decoder Llama 3, Qwen3, Qwen3-MoE and DeepSeek-V3 share, declared by its args as data: the model, its
block, attention and its variations (grouped-query with q/k norm, multi-head latent), RMSNorm, rotary
embeddings and their scalings, multi-token prediction modules, the plan, the parameter counts, and the Hugging
Face mapping the families' adapters subclass. A family folder (llama3/, qwen3/, qwen3_moe/, deepseek_v3/) holds
flavors, its Hugging Face mapping and its plan."""

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.block import BlockOutput, TransformerBlock
from titan_models.decoder.flops import count_params, flops_per_token, num_params
from titan_models.decoder.hf import DecoderHFAdapter
from titan_models.decoder.mla_args import MLAArgs
from titan_models.decoder.model import Decoder
from titan_models.decoder.mtp import MTPDepth, MTPModule, mtp_targets, shift_document_ids
from titan_models.decoder.plan import decoder_plan, decoder_tp_plan
from titan_models.decoder.rope import RopeScaling, YarnScaling

__all__ = [
    "BlockOutput",
    "Decoder",
    "DecoderArgs",
    "DecoderHFAdapter",
    "MLAArgs",
    "MTPDepth",
    "MTPModule",
    "RopeScaling",
    "TransformerBlock",
    "YarnScaling",
    "count_params",
    "decoder_plan",
    "decoder_tp_plan",
    "flops_per_token",
    "mtp_targets",
    "shift_document_ids",
    "num_params",
]
