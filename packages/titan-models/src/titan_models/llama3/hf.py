"""Mapping between our Llama 3 state dict and Hugging Face's LlamaForCausalLM, one tensor at a time.

Converters stream: they ask for each tensor's new name and new value without holding a whole state dict.
titan-checkpoint finds this adapter through the "titan.hf_adapters" entry point, never by import.

Rotary layout: our wq/wk rows for each head are ordered as adjacent pairs (Meta's complex layout); HF
pairs row k with row k + head_dim / 2 (rotate_half). to_hf permutes q/k rows the way Hugging Face's
convert_llama_weights_to_hf.py does; from_hf undoes it.
"""

from __future__ import annotations

import copy
import re
from dataclasses import asdict
from typing import Any

import torch

from titan_models.llama3.args import Llama3Args, RopeScaling
from titan_models.llama3.flavors import FLAVORS

_TOP_LEVEL = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_PER_LAYER = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_TOP_LEVEL_FROM_HF = {hf: ours for ours, hf in _TOP_LEVEL.items()}
_PER_LAYER_FROM_HF = {hf: ours for ours, hf in _PER_LAYER.items()}
_OUR_LAYER_KEY = re.compile(r"layers\.(\d+)\.(.+)")
_HF_LAYER_KEY = re.compile(r"model\.layers\.(\d+)\.(.+)")


def _interleaved_to_halves(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    rows, cols = weight.shape
    return weight.reshape(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def _halves_to_interleaved(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    rows, cols = weight.shape
    return weight.reshape(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


class Llama3HFAdapter:
    """Names and tensors of one Llama 3 shape, ours <-> Hugging Face."""

    def __init__(self, args: Llama3Args):
        args.validate()
        self.args = args

    @classmethod
    def from_flavor(cls, flavor: str) -> Llama3HFAdapter:
        if flavor not in FLAVORS:
            raise ValueError(f"flavor={flavor!r} is not a Llama 3 flavor; use one of {', '.join(FLAVORS)}")
        # A copy: the adapter keeps its args, and the shared flavor table must not change through it.
        return cls(copy.deepcopy(FLAVORS[flavor]))

    @classmethod
    def from_args_dict(cls, fields: dict[str, Any]) -> Llama3HFAdapter:
        """From Llama3Args fields as plain data (e.g. stored in checkpoint metadata)."""
        fields = dict(fields)
        if isinstance(fields.get("rope_scaling"), dict):
            fields["rope_scaling"] = RopeScaling(**fields["rope_scaling"])
        return cls(Llama3Args(**fields))

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> Llama3HFAdapter:
        return cls(args_from_hf_config(config))

    def hf_config(self, dtype: torch.dtype | str = torch.bfloat16, **token_ids: int | None) -> dict[str, Any]:
        return hf_config(self.args, dtype, **token_ids)

    def _layer(self, match: re.Match[str], key: str) -> int:
        layer = int(match.group(1))
        if layer >= self.args.n_layers:
            raise ValueError(f"{key!r}: layer {layer} does not exist, the model has n_layers={self.args.n_layers}")
        return layer

    def to_hf_key(self, fqn: str) -> str:
        if fqn in _TOP_LEVEL:
            return _TOP_LEVEL[fqn]
        match = _OUR_LAYER_KEY.fullmatch(fqn)
        if match and match.group(2) in _PER_LAYER:
            return f"model.layers.{self._layer(match, fqn)}.{_PER_LAYER[match.group(2)]}"
        raise ValueError(f"{fqn!r} is not a Llama 3 parameter name (expected e.g. 'layers.0.attention.wq.weight')")

    def from_hf_key(self, hf_key: str) -> str:
        if hf_key in _TOP_LEVEL_FROM_HF:
            return _TOP_LEVEL_FROM_HF[hf_key]
        match = _HF_LAYER_KEY.fullmatch(hf_key)
        if match and match.group(2) in _PER_LAYER_FROM_HF:
            return f"layers.{self._layer(match, hf_key)}.{_PER_LAYER_FROM_HF[match.group(2)]}"
        raise ValueError(
            f"{hf_key!r} is not a LlamaForCausalLM parameter name "
            f"(expected e.g. 'model.layers.0.self_attn.q_proj.weight')"
        )

    def _rotary_heads(self, fqn: str) -> int | None:
        """Heads whose rows need the rotary permutation, or None for tensors that map unchanged."""
        if fqn.endswith("attention.wq.weight"):
            return self.args.n_heads
        if fqn.endswith("attention.wk.weight"):
            return self.args.num_kv_heads
        return None

    def to_hf_tensor(self, fqn: str, tensor: torch.Tensor) -> torch.Tensor:
        n_heads = self._rotary_heads(fqn)
        return tensor if n_heads is None else _interleaved_to_halves(tensor, n_heads)

    def from_hf_tensor(self, hf_key: str, tensor: torch.Tensor) -> torch.Tensor:
        n_heads = self._rotary_heads(self.from_hf_key(hf_key))
        return tensor if n_heads is None else _halves_to_interleaved(tensor, n_heads)

    def to_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {self.to_hf_key(k): self.to_hf_tensor(k, v) for k, v in state_dict.items()}

    def from_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {self.from_hf_key(k): self.from_hf_tensor(k, v) for k, v in state_dict.items()}

    def hf_keys(self) -> list[str]:
        """Every tensor name a complete LlamaForCausalLM checkpoint of this shape holds."""
        per_layer = [f"model.layers.{i}.{name}" for i in range(self.args.n_layers) for name in _PER_LAYER.values()]
        return ["model.embed_tokens.weight", *per_layer, "model.norm.weight", "lm_head.weight"]


def hf_config(
    args: Llama3Args,
    dtype: torch.dtype | str = torch.bfloat16,
    bos_token_id: int | None = None,
    eos_token_id: int | list[int] | None = None,
) -> dict[str, Any]:
    """config.json for LlamaForCausalLM with the shape of `args`; dtype: that of the exported tensors."""
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
        "rope_scaling": None,
        "vocab_size": args.vocab_size,
        "max_position_embeddings": args.max_seq_len,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if args.rope_scaling is not None:
        config["rope_scaling"] = {"rope_type": "llama3", **asdict(args.rope_scaling)}
    if bos_token_id is not None:
        config["bos_token_id"] = bos_token_id
    if eos_token_id is not None:
        config["eos_token_id"] = eos_token_id
    return config


def args_from_hf_config(config: dict[str, Any]) -> Llama3Args:
    """Llama3Args for a LlamaForCausalLM config.json (rope settings in either the rope_scaling / rope_theta
    keys or transformers 5's rope_parameters)."""
    architectures = config.get("architectures") or ["LlamaForCausalLM"]
    if "LlamaForCausalLM" not in architectures:
        raise ValueError(f"config architectures={architectures} is not LlamaForCausalLM")
    if config.get("tie_word_embeddings", False):
        raise ValueError("config tie_word_embeddings=true is not supported: Llama3Args has an untied output layer")
    for bias in ("attention_bias", "mlp_bias"):
        if config.get(bias, False):
            raise ValueError(f"config {bias}=true is not supported: our Llama 3 projections have no bias")
    dim, n_heads = config["hidden_size"], config["num_attention_heads"]
    if config.get("head_dim") not in (None, dim // n_heads):
        raise ValueError(
            f"config head_dim={config['head_dim']} differs from hidden_size / num_attention_heads = "
            f"{dim // n_heads}; not supported"
        )

    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "llama3":
        scaling = RopeScaling(
            factor=rope["factor"],
            low_freq_factor=rope["low_freq_factor"],
            high_freq_factor=rope["high_freq_factor"],
            original_max_position_embeddings=rope["original_max_position_embeddings"],
        )
    elif rope_type == "default":
        scaling = None
    else:
        raise ValueError(f"config rope_type={rope_type!r} is not supported; expected 'llama3' or 'default'")

    args = Llama3Args(
        dim=dim,
        n_layers=config["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=config.get("num_key_value_heads", n_heads),
        vocab_size=config["vocab_size"],
        ffn_hidden_dim=config["intermediate_size"],
        norm_eps=config.get("rms_norm_eps", 1e-5),
        rope_theta=rope_theta,
        rope_scaling=scaling,
        max_seq_len=config.get("max_position_embeddings", 2048),
    )
    args.validate()
    return args
