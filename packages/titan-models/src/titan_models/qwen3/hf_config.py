"""DecoderArgs <-> a Hugging Face Qwen3ForCausalLM config.json (Qwen3-MoE's is titan_models.qwen3_moe)."""

from __future__ import annotations

from typing import Any

import torch

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.hf_config import decoder_config, qk_norm_config, qk_norm_fields
from titan_models.qwen3_moe.hf_config import SPARSE
from titan_models.qwen3_moe.hf_config import args_from_hf_config as sparse_args_from_hf_config
from titan_models.qwen3_moe.hf_config import hf_config as sparse_hf_config

DENSE = "Qwen3ForCausalLM"


def hf_config(
    args: DecoderArgs,
    dtype: torch.dtype | str = torch.bfloat16,
    bos_token_id: int | None = None,
    eos_token_id: int | list[int] | None = None,
) -> dict[str, Any]:
    """config.json for Qwen3ForCausalLM; for args with experts, Qwen3MoeForCausalLM's (as before 0.16, when
    this module wrote both)."""
    if args.moe is not None:
        return sparse_hf_config(args, dtype, bos_token_id=bos_token_id, eos_token_id=eos_token_id)
    return qk_norm_config(decoder_config(args, DENSE, "qwen3", dtype, bos_token_id, eos_token_id), args)


def args_from_hf_config(config: dict[str, Any]) -> DecoderArgs:
    """DecoderArgs for a Qwen3 config.json; a Qwen3-MoE one is read too (as before 0.16)."""
    architectures = config.get("architectures") or []
    if not {DENSE, SPARSE} & set(architectures):
        raise ValueError(f"config architectures={architectures} is neither {DENSE} nor {SPARSE}")
    if SPARSE in architectures:
        return sparse_args_from_hf_config(config)
    args = DecoderArgs(**qk_norm_fields(config))
    args.validate()
    return args
