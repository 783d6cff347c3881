"""DecoderArgs (with MLA and a DeepSeek MoE) <-> a Hugging Face DeepseekV3ForCausalLM config.json."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.hf_config import mtp_layers_of, with_token_ids
from titan_models.decoder.mla_args import MLAArgs
from titan_models.decoder.rope import YarnScaling
from titan_models.moe.args import MoEArgs

ARCHITECTURE = "DeepseekV3ForCausalLM"


def hf_config(
    args: DecoderArgs,
    dtype: torch.dtype | str = torch.bfloat16,
    bos_token_id: int | None = None,
    eos_token_id: int | list[int] | None = None,
) -> dict[str, Any]:
    """config.json for DeepseekV3ForCausalLM with the shape of `args` (MLA, and a DeepSeek MoE whose dense
    layers are the first k) and its multi-token prediction modules (num_nextn_predict_layers)."""
    mla, moe = args.mla, args.moe
    if mla is None or moe is None:
        raise ValueError("a DeepSeek-V3 config needs Llama3Args.mla and Llama3Args.moe")
    first_dense = _first_k_dense(moe)
    if moe.score_func != "sigmoid" or moe.sparse_step != 1:
        raise ValueError(f"DeepSeek-V3 routes by sigmoid scores, every layer after the first k sparse; got {moe}")
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": args.rope_theta}
    if isinstance(args.rope_scaling, YarnScaling):
        rope = {"rope_type": "yarn", "rope_theta": args.rope_theta, **asdict(args.rope_scaling)}
    elif args.rope_scaling is not None:
        raise ValueError(f"DeepSeek-V3 configs here use plain or YaRN RoPE, not {args.rope_scaling}")
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURE],
        "model_type": "deepseek_v3",
        "hidden_size": args.dim,
        "intermediate_size": args.hidden_dim,
        "moe_intermediate_size": moe.hidden_dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_heads,
        "n_routed_experts": moe.num_experts,
        "n_shared_experts": moe.num_shared_experts,
        "num_experts_per_tok": moe.top_k,
        "routed_scaling_factor": moe.routed_scaling_factor,
        "n_group": moe.num_expert_groups,
        "topk_group": moe.num_limited_groups,
        "norm_topk_prob": moe.norm_topk_prob,
        "first_k_dense_replace": first_dense,
        "kv_lora_rank": mla.kv_lora_rank,
        "q_lora_rank": mla.q_lora_rank,
        "qk_nope_head_dim": mla.qk_nope_head_dim,
        "qk_rope_head_dim": mla.qk_rope_head_dim,
        "v_head_dim": mla.v_head_dim,
        "head_dim": mla.qk_rope_head_dim,
        "rope_interleave": True,
        "hidden_act": "silu",
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": None if rope["rope_type"] == "default" else rope,
        "rope_parameters": rope,
        "vocab_size": args.vocab_size,
        "max_position_embeddings": args.max_seq_len,
        "attention_bias": False,
        "tie_word_embeddings": args.tie_word_embeddings,
        # Always written: transformers' DeepseekV3Config assumes 1 where the key is missing.
        "num_nextn_predict_layers": args.mtp_layers,
        "dtype": str(dtype).removeprefix("torch."),
    }
    return with_token_ids(config, bos_token_id, eos_token_id)


def _first_k_dense(moe: MoEArgs) -> int:
    k = len(moe.dense_layers)
    if moe.dense_layers != tuple(range(k)):
        raise ValueError(f"DeepSeek-V3's dense layers are the first k; MoEArgs.dense_layers={moe.dense_layers}")
    return k


def args_from_hf_config(config: dict[str, Any]) -> DecoderArgs:
    """DecoderArgs for a DeepseekV3ForCausalLM config.json. The selection bias (e_score_correction_bias) is
    DeepSeek-V3's auxiliary-loss-free balancing, so that is the load balancing the args carry. mtp_layers is what
    the config declares; a folder's are those its weights also hold (decoder/hf_folder.py)."""
    architectures = config.get("architectures") or []
    if ARCHITECTURE not in architectures:
        raise ValueError(f"config architectures={architectures} is not {ARCHITECTURE}")
    if config.get("attention_bias", False):
        raise ValueError("config attention_bias=true is not supported: our attention projections have no bias")
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config hidden_act={config['hidden_act']!r} is not supported: SwiGLU here uses silu")
    if not config.get("rope_interleave", True):
        raise ValueError("config rope_interleave=false is not supported: the rotary weights here are interleaved")
    n_heads = config["num_attention_heads"]
    if config.get("num_key_value_heads", n_heads) != n_heads:
        raise ValueError("config num_key_value_heads must equal num_attention_heads in multi-head latent attention")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "yarn":
        fields = {f: rope[f] for f in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                                       "mscale", "mscale_all_dim") if rope.get(f) is not None}  # fmt: skip
        scaling = YarnScaling(**fields)
    elif rope_type == "default":
        scaling = None
    else:
        raise ValueError(f"config rope_type={rope_type!r} is not supported; expected 'yarn' or 'default'")
    first_dense = config.get("first_k_dense_replace", 0)
    args = DecoderArgs(
        dim=config["hidden_size"],
        n_layers=config["num_hidden_layers"],
        n_heads=n_heads,
        vocab_size=config["vocab_size"],
        ffn_hidden_dim=config["intermediate_size"],
        norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
        rope_scaling=scaling,
        max_seq_len=config.get("max_position_embeddings", 4096),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        mtp_layers=mtp_layers_of(config),
        mla=MLAArgs(
            kv_lora_rank=config["kv_lora_rank"],
            q_lora_rank=config.get("q_lora_rank"),
            qk_nope_head_dim=config["qk_nope_head_dim"],
            qk_rope_head_dim=config["qk_rope_head_dim"],
            v_head_dim=config["v_head_dim"],
        ),
        moe=MoEArgs(
            num_experts=config["n_routed_experts"],
            top_k=config["num_experts_per_tok"],
            hidden_dim=config["moe_intermediate_size"],
            score_func="sigmoid",
            norm_topk_prob=bool(config.get("norm_topk_prob", True)),
            routed_scaling_factor=float(config.get("routed_scaling_factor", 1.0)),
            num_shared_experts=config.get("n_shared_experts") or 0,
            num_expert_groups=config.get("n_group") or 1,
            num_limited_groups=config.get("topk_group") or 1,
            dense_layers=tuple(range(first_dense)),
            load_balance="aux_loss_free",
        ),
    )
    args.validate()
    return args
