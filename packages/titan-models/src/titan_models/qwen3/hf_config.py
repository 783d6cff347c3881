"""Llama3Args <-> a Hugging Face Qwen3ForCausalLM / Qwen3MoeForCausalLM config.json."""

from __future__ import annotations

from typing import Any

import torch

from titan_models.llama3.args import Llama3Args
from titan_models.llama3.hf_config import decoder_fields
from titan_models.llama3.hf_config import hf_config as llama_hf_config
from titan_models.moe.args import MoEArgs

DENSE, SPARSE = "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"


def hf_config(
    args: Llama3Args,
    dtype: torch.dtype | str = torch.bfloat16,
    bos_token_id: int | None = None,
    eos_token_id: int | list[int] | None = None,
) -> dict[str, Any]:
    """config.json for Qwen3ForCausalLM, or Qwen3MoeForCausalLM when args.moe is set."""
    if args.rope_scaling is not None:
        raise ValueError("Qwen3 configs here use plain RoPE; Llama3Args.rope_scaling must be None")
    config = llama_hf_config(args, dtype, bos_token_id, eos_token_id)
    for llama_only in ("rope_scaling", "mlp_bias"):
        config.pop(llama_only)
    config.update(
        architectures=[SPARSE if args.moe else DENSE],
        model_type="qwen3_moe" if args.moe else "qwen3",
        use_sliding_window=False,
        sliding_window=None,
    )
    moe = args.moe
    if moe is not None:
        if moe.score_func != "softmax" or moe.num_shared_experts or moe.routed_scaling_factor != 1.0:
            raise ValueError(
                f"Qwen3-MoE routes by softmax with no shared experts and no routed scaling; these MoEArgs differ: {moe}"
            )
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


def args_from_hf_config(config: dict[str, Any]) -> Llama3Args:
    """Llama3Args for a Qwen3 or Qwen3-MoE config.json (its architecture says which)."""
    architectures = config.get("architectures") or []
    if not {DENSE, SPARSE} & set(architectures):
        raise ValueError(f"config architectures={architectures} is neither {DENSE} nor {SPARSE}")
    if config.get("use_sliding_window", False):
        raise ValueError("config use_sliding_window=true is not supported: attention here is full causal")
    fields = decoder_fields(config, default_eps=1e-6)
    fields.update(attention_head_dim=config.get("head_dim") or fields["dim"] // fields["n_heads"], qk_norm=True)
    if SPARSE in architectures:
        fields["moe"] = MoEArgs(
            num_experts=config.get("num_experts", config.get("num_local_experts")),
            top_k=config["num_experts_per_tok"],
            hidden_dim=config["moe_intermediate_size"],
            norm_topk_prob=bool(config.get("norm_topk_prob", False)),
            sparse_step=config.get("decoder_sparse_step", 1),
            dense_layers=tuple(config.get("mlp_only_layers") or ()),
            aux_loss_coef=config.get("router_aux_loss_coef", 0.001),
        )
    args = Llama3Args(**fields)
    args.validate()
    return args
