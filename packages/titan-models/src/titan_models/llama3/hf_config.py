"""Llama3Args <-> a Hugging Face LlamaForCausalLM config.json: what the model is, without its tensors
(the tensors' mapping is hf.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from typing import Any

import torch

from titan_models.llama3.args import Llama3Args, RopeScaling, YarnScaling
from titan_models.mla.args import MLAArgs
from titan_models.moe.args import MoEArgs


def args_from_dict(fields: dict[str, Any]) -> Llama3Args:
    """Llama3Args from its fields as plain data (a checkpoint's metadata); fields it does not know name the
    field and the fix."""
    fields = dict(fields)
    known = {f.name for f in dataclasses.fields(Llama3Args)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"Llama3Args has no field(s) {', '.join(unknown)}; was this written by a newer titan-models?")
    if isinstance(fields.get("rope_scaling"), dict):
        scaling = fields["rope_scaling"]
        fields["rope_scaling"] = YarnScaling(**scaling) if "beta_fast" in scaling else RopeScaling(**scaling)
    if isinstance(fields.get("mla"), dict):
        fields["mla"] = MLAArgs(**fields["mla"])
    if isinstance(fields.get("moe"), dict):
        moe = dict(fields["moe"])
        moe["dense_layers"] = tuple(moe.get("dense_layers", ()))
        fields["moe"] = MoEArgs(**moe)
    return Llama3Args(**fields)


def hf_config(
    args: Llama3Args,
    dtype: torch.dtype | str = torch.bfloat16,
    bos_token_id: int | None = None,
    eos_token_id: int | list[int] | None = None,
) -> dict[str, Any]:
    """config.json for LlamaForCausalLM with the shape of `args`; dtype: that of the exported tensors.

    RoPE is written twice: `rope_parameters` (transformers 5) and `rope_theta` / `rope_scaling` (what
    transformers 4, vLLM and TGI read); both give the same frequencies. max_position_embeddings is the
    model's max_seq_len, the context its RoPE table covers."""
    rope_scaling = None if args.rope_scaling is None else {"rope_type": "llama3", **asdict(args.rope_scaling)}
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": args.dim,
        "intermediate_size": args.hidden_dim,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.num_kv_heads,
        "num_hidden_layers": args.n_layers,
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": rope_scaling,
        "rope_parameters": {"rope_type": "default", **(rope_scaling or {}), "rope_theta": args.rope_theta},
        "vocab_size": args.vocab_size,
        "max_position_embeddings": args.max_seq_len,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": args.tie_word_embeddings,
        "dtype": str(dtype).removeprefix("torch."),
    }
    return with_token_ids(config, bos_token_id, eos_token_id)


def with_token_ids(config: dict[str, Any], bos_token_id: int | None, eos_token_id: int | list[int] | None) -> dict:
    """`config` with the token ids that are given (config.json leaves an unknown one out)."""
    if bos_token_id is not None:
        config["bos_token_id"] = bos_token_id
    if eos_token_id is not None:
        config["eos_token_id"] = eos_token_id
    return config


def args_from_hf_config(config: dict[str, Any]) -> Llama3Args:
    """Llama3Args for a LlamaForCausalLM config.json of any Llama 3 / 3.1 / 3.2 (rope settings in either
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
    args = Llama3Args(**decoder_fields(config, default_eps=1e-5))
    args.validate()
    return args


def decoder_fields(config: dict[str, Any], default_eps: float) -> dict[str, Any]:
    """The Llama3Args fields every decoder sharing Llama's config.json keys reads (Llama 3, Qwen3)."""
    if config.get("attention_bias", False):
        raise ValueError("config attention_bias=true is not supported: our attention projections have no bias")
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config hidden_act={config['hidden_act']!r} is not supported: SwiGLU here uses silu")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "llama3":
        scaling = RopeScaling(
            factor=float(rope["factor"]),
            low_freq_factor=float(rope["low_freq_factor"]),
            high_freq_factor=float(rope["high_freq_factor"]),
            original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
        )
    elif rope_type == "default":
        scaling = None
    else:
        raise ValueError(f"config rope_type={rope_type!r} is not supported; expected 'llama3' or 'default'")
    n_heads = config["num_attention_heads"]
    return {
        "dim": config["hidden_size"],
        "n_layers": config["num_hidden_layers"],
        "n_heads": n_heads,
        "n_kv_heads": config.get("num_key_value_heads", n_heads),
        "vocab_size": config["vocab_size"],
        "ffn_hidden_dim": config["intermediate_size"],
        "norm_eps": config.get("rms_norm_eps", default_eps),
        "rope_theta": float(rope_theta),
        "rope_scaling": scaling,
        "max_seq_len": config.get("max_position_embeddings", 2048),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
    }
