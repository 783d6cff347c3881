"""DecoderArgs <-> a Hugging Face LlamaForCausalLM config.json: what the model is, without its tensors
(the tensors' mapping is hf.py)."""

from __future__ import annotations

from typing import Any

import torch

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.hf_config import decoder_config, decoder_fields

ARCHITECTURE = "LlamaForCausalLM"


def hf_config(
    args: DecoderArgs,
    dtype: torch.dtype | str = torch.bfloat16,
    bos_token_id: int | None = None,
    eos_token_id: int | list[int] | None = None,
) -> dict[str, Any]:
    """config.json for LlamaForCausalLM with the shape of `args` (decoder_config's keys)."""
    return decoder_config(args, ARCHITECTURE, "llama", dtype, bos_token_id, eos_token_id)


def args_from_hf_config(config: dict[str, Any]) -> DecoderArgs:
    """DecoderArgs for a LlamaForCausalLM config.json of any Llama 3 / 3.1 / 3.2 (rope settings in either
    transformers 5's rope_parameters or the rope_scaling / rope_theta keys)."""
    architectures = config.get("architectures") or ["LlamaForCausalLM"]
    if "LlamaForCausalLM" not in architectures:
        raise ValueError(f"config architectures={architectures} is not LlamaForCausalLM")
    if config.get("mlp_bias", False):
        raise ValueError("config mlp_bias=true is not supported: our Llama 3 projections have no bias")
    dim, n_heads = config["hidden_size"], config["num_attention_heads"]
    if config.get("head_dim") not in (None, dim // n_heads):
        raise ValueError(
            f"config head_dim={config['head_dim']} differs from hidden_size / num_attention_heads = "
            f"{dim // n_heads}; not supported"
        )
    args = DecoderArgs(**decoder_fields(config, default_eps=1e-5))
    args.validate()
    return args
