"""Decoder args <-> Hugging Face config.json, the parts the families share: the args as plain data (checkpoint
metadata), Llama's config keys (which Qwen3's build on) and the fields they give."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from typing import Any

import torch

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.mla_args import MLAArgs
from titan_models.decoder.rope import RopeScaling, YarnScaling
from titan_models.linear_attention.args import GatedDeltaNetArgs
from titan_models.moe.args import MoEArgs


def args_from_dict(fields: dict[str, Any]) -> DecoderArgs:
    """DecoderArgs from its fields as plain data (a checkpoint's metadata); fields it does not know name the
    field and the fix."""
    fields = dict(fields)
    known = {f.name for f in dataclasses.fields(DecoderArgs)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"Llama3Args has no field(s) {', '.join(unknown)}; was this written by a newer titan-models?")
    if isinstance(fields.get("rope_scaling"), dict):
        scaling = fields["rope_scaling"]
        fields["rope_scaling"] = YarnScaling(**scaling) if "beta_fast" in scaling else RopeScaling(**scaling)
    if isinstance(fields.get("mla"), dict):
        fields["mla"] = MLAArgs(**fields["mla"])
    if isinstance(fields.get("linear_attention"), dict):
        fields["linear_attention"] = GatedDeltaNetArgs(**fields["linear_attention"])
    if isinstance(fields.get("moe"), dict):
        moe = dict(fields["moe"])
        moe["dense_layers"] = tuple(moe.get("dense_layers", ()))
        fields["moe"] = MoEArgs(**moe)
    return DecoderArgs(**fields)


def decoder_config(
    args: DecoderArgs,
    architecture: str,
    model_type: str,
    dtype: torch.dtype | str = torch.bfloat16,
    bos_token_id: int | None = None,
    eos_token_id: int | list[int] | None = None,
) -> dict[str, Any]:
    """config.json in Llama's keys (LlamaForCausalLM's, which the other decoders' configs build on) for
    `architecture` / `model_type` with the shape of `args`; dtype: that of the exported tensors.

    RoPE is written twice: `rope_parameters` (transformers 5) and `rope_theta` / `rope_scaling` (what
    transformers 4, vLLM and TGI read); both give the same frequencies. max_position_embeddings is the
    model's max_seq_len, the context its RoPE table covers. Multi-token prediction modules are written as
    DeepSeek-V3's `num_nextn_predict_layers` only when the model has them (Llama's and Qwen3's configs have no
    such key; transformers keeps it as an unused attribute), so a config without MTP is unchanged."""
    rope_scaling = None if args.rope_scaling is None else {"rope_type": "llama3", **asdict(args.rope_scaling)}
    config: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": model_type,
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
    if args.mtp_layers:
        config["num_nextn_predict_layers"] = args.mtp_layers
    return with_token_ids(config, bos_token_id, eos_token_id)


def with_token_ids(config: dict[str, Any], bos_token_id: int | None, eos_token_id: int | list[int] | None) -> dict:
    """`config` with the token ids that are given (config.json leaves an unknown one out)."""
    if bos_token_id is not None:
        config["bos_token_id"] = bos_token_id
    if eos_token_id is not None:
        config["eos_token_id"] = eos_token_id
    return config


def decoder_fields(config: dict[str, Any], default_eps: float) -> dict[str, Any]:
    """The DecoderArgs fields every decoder sharing Llama's config.json keys reads (Llama 3, Qwen3, Qwen3-MoE)."""
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
        "mtp_layers": mtp_layers_of(config),
    }


def mtp_layers_of(config: dict[str, Any]) -> int:
    """The multi-token prediction modules a config.json declares (DeepSeek-V3's num_nextn_predict_layers, which
    transformers also reads as num_mtp_layers); whether the folder's weights hold them is hf_folder.py's question."""
    layers = config.get("num_nextn_predict_layers", config.get("num_mtp_layers")) or 0
    if not isinstance(layers, int) or layers < 0:
        raise ValueError(f"config num_nextn_predict_layers={layers!r} must be an integer >= 0")
    return layers


def qk_norm_config(config: dict[str, Any], args: DecoderArgs) -> dict[str, Any]:
    """`config` (decoder_config's, for `args`) in Qwen3's keys, those of a decoder with per-head q/k norm and a
    head width of its own (Qwen3 and Qwen3-MoE write them): plain RoPE, full causal attention."""
    if args.rope_scaling is not None:
        raise ValueError("Qwen3 configs here use plain RoPE; Llama3Args.rope_scaling must be None")
    for llama_only in ("rope_scaling", "mlp_bias"):
        config.pop(llama_only)
    config.update(use_sliding_window=False, sliding_window=None)
    return config


def qk_norm_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The DecoderArgs fields of a config.json in Qwen3's keys (qk_norm_config's)."""
    if config.get("use_sliding_window", False):
        raise ValueError("config use_sliding_window=true is not supported: attention here is full causal")
    fields = decoder_fields(config, default_eps=1e-6)
    fields.update(attention_head_dim=config.get("head_dim") or fields["dim"] // fields["n_heads"], qk_norm=True)
    return fields
