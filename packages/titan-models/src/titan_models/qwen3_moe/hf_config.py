"""DecoderArgs <-> a Hugging Face Qwen3MoeForCausalLM config.json: Qwen3's keys and the experts'."""

from __future__ import annotations

from typing import Any

import torch

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.hf_config import decoder_config, qk_norm_config, qk_norm_fields
from titan_models.moe.args import MoEArgs

SPARSE = "Qwen3MoeForCausalLM"


def hf_config(args: DecoderArgs, dtype: torch.dtype | str = torch.bfloat16, **token_ids: Any) -> dict[str, Any]:
    """config.json for Qwen3MoeForCausalLM with the shape of `args`; token_ids: bos_token_id, eos_token_id."""
    moe = args.moe
    if moe is None:
        raise ValueError("a Qwen3-MoE config needs Llama3Args.moe")
    if moe.score_func != "softmax" or moe.num_shared_experts or moe.routed_scaling_factor != 1.0:
        raise ValueError(
            f"Qwen3-MoE routes by softmax with no shared experts and no routed scaling; these MoEArgs differ: {moe}"
        )
    config = qk_norm_config(decoder_config(args, SPARSE, "qwen3_moe", dtype, **token_ids), args)
    config.update(
        num_experts=moe.num_experts,
        num_experts_per_tok=moe.top_k,
        moe_intermediate_size=moe.hidden_dim,
        norm_topk_prob=moe.norm_topk_prob,
        decoder_sparse_step=moe.sparse_step,
        mlp_only_layers=list(moe.dense_layers),
        router_aux_loss_coef=moe.aux_loss_coef,
    )
    return config


def args_from_hf_config(config: dict[str, Any]) -> DecoderArgs:
    """DecoderArgs for a Qwen3-MoE config.json."""
    architectures = config.get("architectures") or []
    if SPARSE not in architectures:
        raise ValueError(f"config architectures={architectures} is not {SPARSE}")
    args = DecoderArgs(
        **qk_norm_fields(config),
        moe=MoEArgs(
            num_experts=config.get("num_experts", config.get("num_local_experts")),
            top_k=config["num_experts_per_tok"],
            hidden_dim=config["moe_intermediate_size"],
            norm_topk_prob=bool(config.get("norm_topk_prob", False)),
            sparse_step=config.get("decoder_sparse_step", 1),
            dense_layers=tuple(config.get("mlp_only_layers") or ()),
            aux_loss_coef=config.get("router_aux_loss_coef", 0.001),
        ),
    )
    args.validate()
    return args
