"""DecoderArgs <-> a Hugging Face GptOssForCausalLM config.json (transformers' GptOssConfig): the decoder's shape,
its attention variations (sinks, sliding windows by layer_types, projection biases), YaRN RoPE and the experts'."""

from __future__ import annotations

from typing import Any

import torch

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.hf_config import with_token_ids
from titan_models.decoder.rope import YarnScaling
from titan_models.moe.args import MoEArgs

ARCHITECTURE = "GptOssForCausalLM"


def gpt_oss_moe(num_experts: int, top_k: int, hidden_dim: int, swiglu_limit: float = 7.0, **fields: Any) -> MoEArgs:
    """GPT-OSS's sparse layer as MoEArgs data: a biased router, top-k logits then a softmax over those k (softmax
    scores renormalised over the top k), biased experts with the clamped SwiGLU, every layer sparse."""
    return MoEArgs(
        num_experts=num_experts, top_k=top_k, hidden_dim=hidden_dim, score_func="softmax", norm_topk_prob=True,
        router_bias=True, expert_proj_bias=True, expert_activation="clamped_swiglu", swiglu_limit=swiglu_limit,
        **fields,
    )  # fmt: skip


def check_gpt_oss(args: DecoderArgs) -> None:
    """Raise ValueError naming the first field GptOssForCausalLM cannot express (its sinks, router and expert
    biases and clamped SwiGLU are fixed parts of the architecture, not options)."""
    moe = args.moe
    if moe is None:
        raise ValueError("a GPT-OSS config needs Llama3Args.moe (every GPT-OSS layer is sparse)")
    expected = gpt_oss_moe(moe.num_experts, moe.top_k, moe.hidden_dim, moe.swiglu_limit)
    for name in ("score_func", "norm_topk_prob", "router_bias", "expert_proj_bias", "expert_activation"):
        if getattr(moe, name) != getattr(expected, name):
            raise ValueError(
                f"GPT-OSS needs Llama3Args.moe.{name}={getattr(expected, name)!r}, got {getattr(moe, name)!r}"
            )
    if moe.num_shared_experts or moe.routed_scaling_factor != 1.0 or moe.num_expert_groups != 1:
        raise ValueError(f"GPT-OSS has no shared experts, routed scaling or expert groups; these MoEArgs differ: {moe}")
    if moe.sparse_step != 1 or moe.dense_layers:
        raise ValueError(
            f"GPT-OSS's layers are all sparse; Llama3Args.moe.sparse_step={moe.sparse_step} and "
            f"dense_layers={moe.dense_layers} must be 1 and ()"
        )
    if not args.attention_sinks:
        raise ValueError("GPT-OSS's attention has sinks; Llama3Args.attention_sinks must be true")
    for name in ("qk_norm", "mla", "mtp_layers"):
        if getattr(args, name):
            raise ValueError(f"GPT-OSS has no {name}; Llama3Args.{name}={getattr(args, name)!r} must be unset")
    if args.rope_scaling is not None and not isinstance(args.rope_scaling, YarnScaling):
        raise ValueError(f"GPT-OSS configs here use plain or YaRN RoPE, not {args.rope_scaling}")


def _rope(args: DecoderArgs) -> dict[str, Any]:
    """rope_parameters as transformers 5 writes them (rope_theta inside). mscale / mscale_all_dim are written only
    when both are set: without them Hugging Face's YaRN scales by mscale(factor), which is what ours does when
    either is 0 (decoder/rope.py rotation_magnitude)."""
    scaling = args.rope_scaling
    if scaling is None:
        return {"rope_type": "default", "rope_theta": args.rope_theta}
    rope = {
        "rope_type": "yarn", "factor": scaling.factor, "beta_fast": scaling.beta_fast, "beta_slow": scaling.beta_slow,
        "original_max_position_embeddings": scaling.original_max_position_embeddings, "truncate": scaling.truncate,
        "rope_theta": args.rope_theta,
    }  # fmt: skip
    if scaling.mscale and scaling.mscale_all_dim:
        rope.update(mscale=scaling.mscale, mscale_all_dim=scaling.mscale_all_dim)
    return rope


def hf_config(
    args: DecoderArgs,
    dtype: torch.dtype | str = torch.bfloat16,
    bos_token_id: int | None = None,
    eos_token_id: int | list[int] | None = None,
) -> dict[str, Any]:
    """config.json for GptOssForCausalLM with the shape of `args`. RoPE is written as rope_parameters
    (transformers 5) and as rope_theta / rope_scaling (transformers 4, vLLM), as the published configs do."""
    check_gpt_oss(args)
    moe, rope = args.moe, _rope(args)
    layer_types = args.layer_types
    if layer_types is None:  # None: every layer slides when there is a window (DecoderArgs.window_for)
        kind = "full_attention" if args.sliding_window is None else "sliding_attention"
        layer_types = [kind] * args.n_layers
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURE],
        "model_type": "gpt_oss",
        "hidden_size": args.dim,
        "intermediate_size": moe.hidden_dim,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.num_kv_heads,
        "num_hidden_layers": args.n_layers,
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": None
        if rope["rope_type"] == "default"
        else {k: v for k, v in rope.items() if k != "rope_theta"},
        "rope_parameters": rope,
        "vocab_size": args.vocab_size,
        "max_position_embeddings": args.max_seq_len,
        "attention_bias": args.attention_bias,
        "sliding_window": args.sliding_window,
        "layer_types": list(layer_types),
        "num_local_experts": moe.num_experts,
        "num_experts_per_tok": moe.top_k,
        "router_aux_loss_coef": moe.aux_loss_coef,
        "swiglu_alpha": moe.swiglu_alpha,
        "swiglu_limit": moe.swiglu_limit,
        "tie_word_embeddings": args.tie_word_embeddings,
        "dtype": str(dtype).removeprefix("torch."),
    }
    return with_token_ids(config, bos_token_id, eos_token_id)


def _rope_scaling(rope: dict[str, Any]) -> YarnScaling | None:
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return None
    if rope_type != "yarn":
        raise ValueError(f"config rope_type={rope_type!r} is not supported; expected 'yarn' or 'default'")
    if rope.get("attention_factor") is not None:
        raise ValueError("config rope_parameters.attention_factor is not supported: ours follows from factor / mscale")
    mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
    both = bool(mscale and mscale_all_dim)  # Hugging Face uses them only together (else mscale(factor) alone)
    return YarnScaling(
        factor=float(rope["factor"]),
        original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
        beta_fast=float(rope.get("beta_fast") or 32.0),
        beta_slow=float(rope.get("beta_slow") or 1.0),
        mscale=float(mscale) if both else 1.0,
        mscale_all_dim=float(mscale_all_dim) if both else 0.0,
        truncate=bool(rope.get("truncate", True)),
    )


def args_from_hf_config(config: dict[str, Any]) -> DecoderArgs:
    """DecoderArgs for a GPT-OSS config.json; keys it leaves out take GptOssConfig's defaults (transformers 5.23)."""
    architectures = config.get("architectures") or []
    if ARCHITECTURE not in architectures:
        raise ValueError(f"config architectures={architectures} is not {ARCHITECTURE}")
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config hidden_act={config['hidden_act']!r} is not supported: GPT-OSS's experts gate by silu")
    n_layers, n_heads = config["num_hidden_layers"], config["num_attention_heads"]
    if "rope_parameters" in config or "rope_scaling" in config:
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    else:  # GptOssConfig's default
        rope = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}  # fmt: skip
    layer_types = config.get("layer_types") or [
        "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)
    ]
    window = config.get("sliding_window", 128)
    if window is None and "sliding_attention" in layer_types:
        layer_types = ["full_attention"] * n_layers  # Hugging Face: no window, every layer attends to all its past
    hidden = config.get("intermediate_size", 2880)
    args = DecoderArgs(
        dim=config["hidden_size"],
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=config.get("num_key_value_heads", n_heads),
        attention_head_dim=config.get("head_dim") or config["hidden_size"] // n_heads,
        vocab_size=config["vocab_size"],
        ffn_hidden_dim=hidden,
        norm_eps=config.get("rms_norm_eps", 1e-5),
        rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 150000.0))),
        rope_scaling=_rope_scaling(rope),
        max_seq_len=config.get("max_position_embeddings", 131072),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=bool(config.get("attention_bias", True)),
        attention_sinks=True,
        sliding_window=window,
        layer_types=list(layer_types),
        moe=gpt_oss_moe(
            num_experts=config.get("num_local_experts", config.get("num_experts", 128)),
            top_k=config.get("num_experts_per_tok", 4),
            hidden_dim=hidden,
            swiglu_limit=float(config.get("swiglu_limit", 7.0)),
            swiglu_alpha=float(config.get("swiglu_alpha", 1.702)),
            aux_loss_coef=config.get("router_aux_loss_coef", 0.001),
        ),
    )
    args.validate()
    return args
