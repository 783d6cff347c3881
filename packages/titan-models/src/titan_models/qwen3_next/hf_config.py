"""DecoderArgs <-> a Hugging Face Qwen3NextForCausalLM config.json: Qwen3's keys, the linear-attention layers'
(linear_*, layer_types), partial RoPE and the experts' (with one gated shared expert)."""

from __future__ import annotations

from typing import Any

import torch

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.hf_config import decoder_config, qk_norm_config, qk_norm_fields
from titan_models.linear_attention.args import GatedDeltaNetArgs
from titan_models.moe.args import MoEArgs

ARCHITECTURE = "Qwen3NextForCausalLM"
DEFAULT_PARTIAL_ROTARY_FACTOR = 0.25
"""What transformers' Qwen3NextConfig assumes when a config.json names no partial_rotary_factor."""


def qwen3_next_moe(experts: int, top_k: int, expert_dim: int, shared_dim: int, **fields: Any) -> MoEArgs:
    """Qwen3-Next's sparse layer: softmax over experts, top-k renormalised, one sigmoid-gated shared expert of
    `shared_dim` hidden units (a multiple of expert_dim here: num_shared_experts * expert_dim)."""
    if shared_dim <= 0 or shared_dim % expert_dim:
        raise ValueError(
            f"config shared_expert_intermediate_size={shared_dim} must be a positive multiple of "
            f"moe_intermediate_size={expert_dim} (the shared expert is num_shared_experts routed experts wide)"
        )
    return MoEArgs(
        num_experts=experts, top_k=top_k, hidden_dim=expert_dim, score_func="softmax", norm_topk_prob=True,
        num_shared_experts=shared_dim // expert_dim, shared_expert_gate=True, **fields,
    )  # fmt: skip


def hf_config(args: DecoderArgs, dtype: torch.dtype | str = torch.bfloat16, **token_ids: Any) -> dict[str, Any]:
    """config.json for Qwen3NextForCausalLM with the shape of `args`; token_ids: bos_token_id, eos_token_id."""
    moe, linear = args.moe, args.linear_attention
    if not (args.attention_output_gate and args.zero_centered_norm and args.qk_norm):
        raise ValueError(
            "Qwen3-Next's attention is gated with zero-centred q/k norms; Llama3Args.attention_output_gate, "
            "zero_centered_norm and qk_norm must all be true"
        )
    if linear is None or args.layer_types is None:
        raise ValueError("a Qwen3-Next config needs Llama3Args.linear_attention and layer_types")
    if moe is None:
        raise ValueError("a Qwen3-Next config needs Llama3Args.moe")
    qwen_moe = qwen3_next_moe(moe.num_experts, moe.top_k, moe.hidden_dim, moe.num_shared_experts * moe.hidden_dim)
    routing = ("score_func", "norm_topk_prob", "shared_expert_gate", "routed_scaling_factor", "router_bias",
               "expert_proj_bias", "expert_activation", "num_expert_groups")  # fmt: skip
    differ = [name for name in routing if getattr(moe, name) != getattr(qwen_moe, name)]
    if differ:
        raise ValueError(f"Qwen3-Next routes by softmax, top-k renormalised, one gated shared expert; MoEArgs {differ}")
    if linear.norm_eps != args.norm_eps:
        raise ValueError(
            f"Qwen3-Next's config has one rms_norm_eps; Llama3Args.linear_attention.norm_eps={linear.norm_eps} "
            f"differs from norm_eps={args.norm_eps}"
        )
    config = qk_norm_config(decoder_config(args, ARCHITECTURE, "qwen3_next", dtype, **token_ids), args)
    for not_qwen3_next in ("use_sliding_window", "sliding_window"):
        config.pop(not_qwen3_next)
    config["rope_parameters"]["partial_rotary_factor"] = args.partial_rotary_factor
    config.update(
        partial_rotary_factor=args.partial_rotary_factor,
        layer_types=list(args.layer_types),
        linear_conv_kernel_dim=linear.conv_kernel_size,
        linear_key_head_dim=linear.key_head_dim,
        linear_value_head_dim=linear.value_head_dim,
        linear_num_key_heads=linear.n_key_heads,
        linear_num_value_heads=linear.n_value_heads,
        num_experts=moe.num_experts,
        num_experts_per_tok=moe.top_k,
        moe_intermediate_size=moe.hidden_dim,
        shared_expert_intermediate_size=moe.num_shared_experts * moe.hidden_dim,
        norm_topk_prob=moe.norm_topk_prob,
        decoder_sparse_step=moe.sparse_step,
        mlp_only_layers=list(moe.dense_layers),
        router_aux_loss_coef=moe.aux_loss_coef,
    )
    return config


def layer_types_of(config: dict[str, Any]) -> list[str]:
    """config's layer_types, or those Qwen3NextConfig derives: every full_attention_interval-th layer full."""
    if config.get("layer_types"):
        return list(config["layer_types"])
    interval = config.get("full_attention_interval", 4)
    return ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(config["num_hidden_layers"])]


def args_from_hf_config(config: dict[str, Any]) -> DecoderArgs:
    """DecoderArgs for a Qwen3-Next config.json."""
    architectures = config.get("architectures") or []
    if ARCHITECTURE not in architectures:
        raise ValueError(f"config architectures={architectures} is not {ARCHITECTURE}")
    if not config.get("num_experts"):
        raise ValueError("config num_experts=0 (no sparse layer) is not supported for Qwen3-Next here")
    fields = qk_norm_fields(config)
    rope = config.get("rope_parameters") or {}
    factor = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", DEFAULT_PARTIAL_ROTARY_FACTOR))
    eps = fields["norm_eps"]
    args = DecoderArgs(
        **fields,
        partial_rotary_factor=float(factor),
        attention_output_gate=True,
        zero_centered_norm=True,
        layer_types=layer_types_of(config),
        linear_attention=GatedDeltaNetArgs(
            dim=fields["dim"],
            n_key_heads=config.get("linear_num_key_heads", 16),
            n_value_heads=config.get("linear_num_value_heads", 32),
            key_head_dim=config.get("linear_key_head_dim", 128),
            value_head_dim=config.get("linear_value_head_dim", 128),
            conv_kernel_size=config.get("linear_conv_kernel_dim", 4),
            norm_eps=eps,
        ),
        moe=qwen3_next_moe(
            config["num_experts"],
            config["num_experts_per_tok"],
            config["moe_intermediate_size"],
            config["shared_expert_intermediate_size"],
            sparse_step=config.get("decoder_sparse_step", 1),
            dense_layers=tuple(config.get("mlp_only_layers") or ()),
            aux_loss_coef=config.get("router_aux_loss_coef", 0.001),
        ),
    )
    args.validate()
    return args
