"""Mapping between our Llama 3 state dict and Hugging Face's LlamaForCausalLM, one tensor at a time.

Converters stream: they ask for each tensor's new name and new value without holding a whole state dict.
config.json <-> Llama3Args is hf_config.py.
titan-checkpoint finds this adapter through the "titan.hf_adapters" entry point, never by import.

Tied embeddings (Llama 3.2 1B / 3B): Hugging Face stores the matrix once, as model.embed_tokens.weight;
our state dict names it twice (tok_embeddings.weight and output.weight, one parameter). `aliases()` says
so: an export skips output.weight, an import fills it from the embedding.

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

from titan_models.llama3.args import Llama3Args
from titan_models.llama3.flavors import FLAVORS
from titan_models.llama3.hf_config import args_from_dict, args_from_hf_config, hf_config

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

    architectures = ("LlamaForCausalLM",)
    """The config.json `architectures` this adapter reads (how an HF folder finds its adapter)."""

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
        return cls(args_from_dict(fields))

    @classmethod
    def from_fingerprint(cls, fingerprint: dict[str, Any]) -> Llama3HFAdapter:
        """From a checkpoint fingerprint whose args leave out max_seq_len (checkpoints written before the
        full args were stored): the named flavor's context length, which training never shortens."""
        fields = dict(fingerprint["args"])
        flavor = FLAVORS.get(fingerprint.get("flavor", ""))
        if "max_seq_len" not in fields and flavor is not None:
            fields["max_seq_len"] = flavor.max_seq_len
        return cls.from_args_dict(fields)

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> Llama3HFAdapter:
        return cls(args_from_hf_config(config))

    def args_dict(self) -> dict[str, Any]:
        """The args as plain data, for checkpoint metadata; from_args_dict reads it back."""
        return asdict(self.args)

    def hf_config(self, dtype: torch.dtype | str = torch.bfloat16, **token_ids: Any) -> dict[str, Any]:
        return hf_config(self.args, dtype, **token_ids)

    def aliases(self) -> dict[str, str]:
        """Our FQNs that name the same tensor as another FQN: {alias: the FQN Hugging Face stores}."""
        return {"output.weight": "tok_embeddings.weight"} if self.args.tie_word_embeddings else {}

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
        aliases = self.aliases()
        return {self.to_hf_key(k): self.to_hf_tensor(k, v) for k, v in state_dict.items() if k not in aliases}

    def from_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        ours = {self.from_hf_key(k): self.from_hf_tensor(k, v) for k, v in state_dict.items()}
        if self.args.tie_word_embeddings and "lm_head.weight" in state_dict:
            # Some tied folders also store lm_head.weight; it must be the embedding, or the model is untied.
            if not torch.equal(state_dict["lm_head.weight"], state_dict["model.embed_tokens.weight"]):
                raise ValueError("tie_word_embeddings=true but lm_head.weight differs from model.embed_tokens.weight")
        ours.update({alias: ours[source] for alias, source in self.aliases().items()})
        return ours

    def hf_keys(self) -> list[str]:
        """Every tensor name a complete LlamaForCausalLM checkpoint of this shape holds."""
        per_layer = [f"model.layers.{i}.{name}" for i in range(self.args.n_layers) for name in _PER_LAYER.values()]
        head = [] if self.args.tie_word_embeddings else ["lm_head.weight"]
        return ["model.embed_tokens.weight", *per_layer, "model.norm.weight", *head]
