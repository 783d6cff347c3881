"""Mapping between our decoder's state dict and Hugging Face's, one tensor at a time: Llama's names
(LlamaForCausalLM's), which Qwen3's and Qwen3-MoE's share, q/k norms and experts included; each family's
adapter (its folder's hf.py) subclasses DecoderHFAdapter with its architecture, flavors and config.json.

Converters stream: they ask for each tensor's new name and new value without holding a whole state dict.
titan-checkpoint finds the family adapters through the "titan.hf_adapters" entry point, never by import.

Tied embeddings (Llama 3.2 1B / 3B): Hugging Face stores the matrix once, as model.embed_tokens.weight;
our state dict names it twice (tok_embeddings.weight and output.weight, one parameter). `aliases()` says
so: an export skips output.weight, an import fills it from the embedding.

Rotary layout: our wq/wk rows for each head are ordered as adjacent pairs (Meta's complex layout); HF
pairs row k with row k + head_dim / 2 (rotate_half). to_hf permutes q/k rows the way Hugging Face's
convert_llama_weights_to_hf.py does; from_hf undoes it.

Multi-token prediction modules (args.mtp_layers, decoder/mtp.py) are DeepSeek-V3's extra layers: module k is
model.layers.<n_layers + k - 1>, its own enorm, hnorm, eh_proj and shared_head.norm under those names and its block
under the names of a block of the last block's kind; config.json's num_nextn_predict_layers counts them (a folder's
are those its weights also hold: hf_folder.py, `from_hf_folder`). DeepSeek's released folders also keep copies of
the shared embedding and output head there (model.layers.<n>.embed_tokens.weight, .shared_head.head.weight), which
vLLM's and SGLang's MTP drafters load as the draft model's own: an export writes them as copies (`hf_copies()`),
an import ignores them (`skips_hf_key()`: never read, so not compared either; DeepSeek trains one shared tensor,
and reading the copies would cost another embedding and head). An import also skips the MTP layers of a folder
beyond the model's own (a run with model.mtp_layers = 0 on a folder that has them: titan-train logs the drop).
transformers' DeepseekV3ForCausalLM has no MTP layer: it reports model.layers.<n_layers>.* as unexpected keys
(unless n_layers is 61, the one layer it ignores by name) and ignores them.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.hf_config import args_from_dict
from titan_models.decoder.hf_folder import with_mtp_layers_held

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
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_QK_NORM = {"attention.q_norm.weight": "self_attn.q_norm.weight", "attention.k_norm.weight": "self_attn.k_norm.weight"}
_DENSE_MLP = {
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
}
_SPARSE_MLP = {
    "feed_forward.router.gate.weight": "mlp.gate.weight",
    "feed_forward.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "feed_forward.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
    "feed_forward.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
}
# Our 3-D expert weights: one Hugging Face Linear weight per expert, [out, in] where ours is [in, out].
_EXPERTS = {
    "feed_forward.experts.w1": "gate_proj.weight",
    "feed_forward.experts.w3": "up_proj.weight",
    "feed_forward.experts.w2": "down_proj.weight",
}
_TOP_LEVEL_FROM_HF = {hf: ours for ours, hf in _TOP_LEVEL.items()}
# A multi-token prediction module's own tensors (decoder/mtp.py), the same names in model.layers.<n_layers + k - 1>.
_MTP_OWN = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")
# DeepSeek's copies of the shared embedding and head in each MTP layer: {name in the layer: the top-level tensor}.
_MTP_COPIES = {"embed_tokens.weight": "model.embed_tokens.weight", "shared_head.head.weight": "lm_head.weight"}
_OUR_MTP_KEY = re.compile(r"mtp\.(\d+)\.(.+)")
_OUR_LAYER_KEY = re.compile(r"layers\.(\d+)\.(.+)")
_HF_LAYER_KEY = re.compile(r"model\.layers\.(\d+)\.(.+)")
_HF_EXPERT_KEY = re.compile(r"mlp\.experts\.(\d+)\.(.+)")


def _interleaved_to_halves(weight: torch.Tensor, n_heads: int, rope_dim: int | None = None) -> torch.Tensor:
    """Rows of each of n_heads equal blocks: the first rope_dim (default: all) from adjacent pairs to halves."""
    return _permute_rotary_rows(weight, n_heads, rope_dim, to_halves=True)


def _halves_to_interleaved(weight: torch.Tensor, n_heads: int, rope_dim: int | None = None) -> torch.Tensor:
    return _permute_rotary_rows(weight, n_heads, rope_dim, to_halves=False)


def _permute_rotary_rows(weight: torch.Tensor, n_heads: int, rope_dim: int | None, to_halves: bool) -> torch.Tensor:
    """The rotary rows of each head reordered, the rest kept: with partial RoPE (Qwen3-Next) only a head's first
    rope_dim rows turn, and a gated query head's rows are [query | gate], the gate unrotated."""
    rows, cols = weight.shape
    heads = weight.reshape(n_heads, rows // n_heads, cols)
    rope_dim = rows // n_heads if rope_dim is None else rope_dim
    rotary = heads[:, :rope_dim]
    pairs = (rope_dim // 2, 2) if to_halves else (2, rope_dim // 2)
    rotary = rotary.reshape(n_heads, *pairs, cols).transpose(1, 2).reshape(n_heads, rope_dim, cols)
    return torch.cat([rotary, heads[:, rope_dim:]], dim=1).reshape(rows, cols)


class DecoderHFAdapter:
    """Names and tensors of one decoder shape, ours <-> Hugging Face, in Llama's names. A family's adapter
    sets the class attributes below (and overrides `_layer_names` where its names differ: DeepSeek-V3)."""

    architectures: tuple[str, ...] = ()
    """The config.json `architectures` this adapter reads (how an HF folder finds its adapter)."""
    flavors: dict[str, DecoderArgs] = {}
    family = "decoder"
    config_to_args: Callable[[dict[str, Any]], DecoderArgs]
    """config.json -> args."""
    args_to_config: Callable[..., dict[str, Any]]
    """(args, dtype, bos_token_id=, eos_token_id=) -> config.json."""

    def __init__(self, args: DecoderArgs):
        args.validate()
        self.args = args

    @classmethod
    def from_flavor(cls, flavor: str) -> DecoderHFAdapter:
        if flavor not in cls.flavors:
            raise ValueError(f"flavor={flavor!r} is not a {cls.family} flavor; use one of {', '.join(cls.flavors)}")
        # A copy: the adapter keeps its args, and the shared flavor table must not change through it.
        return cls(copy.deepcopy(cls.flavors[flavor]))

    @classmethod
    def from_args_dict(cls, fields: dict[str, Any]) -> DecoderHFAdapter:
        """From the args' fields as plain data (e.g. stored in checkpoint metadata)."""
        return cls(args_from_dict(fields))

    @classmethod
    def from_fingerprint(cls, fingerprint: dict[str, Any]) -> DecoderHFAdapter:
        """From a checkpoint fingerprint whose args leave out max_seq_len (checkpoints written before the
        full args were stored): the named flavor's context length, which training never shortens."""
        fields = dict(fingerprint["args"])
        flavor = cls.flavors.get(fingerprint.get("flavor", ""))
        if "max_seq_len" not in fields and flavor is not None:
            fields["max_seq_len"] = flavor.max_seq_len
        return cls.from_args_dict(fields)

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> DecoderHFAdapter:
        return cls(cls.config_to_args(config))

    @classmethod
    def from_hf_folder(cls, folder: str | Path) -> DecoderHFAdapter:
        """From a folder's config.json, with the MTP layers its weights hold (not just those it declares)."""
        config = json.loads((Path(folder) / "config.json").read_text())
        return cls(with_mtp_layers_held(cls.config_to_args(config), folder))

    def args_dict(self) -> dict[str, Any]:
        """The args as plain data, for checkpoint metadata; from_args_dict reads it back."""
        return asdict(self.args)

    def hf_config(self, dtype: torch.dtype | str = torch.bfloat16, **token_ids: Any) -> dict[str, Any]:
        return self.args_to_config(self.args, dtype, **token_ids)

    def aliases(self) -> dict[str, str]:
        """Our FQNs that name the same tensor as another FQN: {alias: the FQN Hugging Face stores}."""
        return {"output.weight": "tok_embeddings.weight"} if self.args.tie_word_embeddings else {}

    def hf_copies(self) -> dict[str, str]:
        """{Hugging Face key written as a copy: the key whose tensor it repeats}: each MTP layer's copies of the
        shared embedding and head, as DeepSeek's folders hold them."""
        head = "model.embed_tokens.weight" if self.args.tie_word_embeddings else "lm_head.weight"
        copies = {}
        for layer in range(self.args.n_layers, self.args.n_layers + self.args.mtp_layers):
            copies[f"model.layers.{layer}.embed_tokens.weight"] = "model.embed_tokens.weight"
            copies[f"model.layers.{layer}.shared_head.head.weight"] = head
        return copies

    def skips_hf_key(self, hf_key: str) -> bool:
        """Whether an import leaves the folder's tensor `hf_key` unread: an MTP layer's copy of the shared embedding
        or head, or any tensor of an MTP layer past the model's (layers from n_layers + mtp_layers on)."""
        match = _HF_LAYER_KEY.fullmatch(hf_key)
        if not match or int(match.group(1)) < self.args.n_layers:
            return False
        return match.group(2) in _MTP_COPIES or int(match.group(1)) >= self.args.n_layers + self.args.mtp_layers

    def _layer(self, match: re.Match[str], key: str) -> int:
        layer = int(match.group(1))
        if layer >= self.args.n_layers:
            raise ValueError(f"{key!r}: layer {layer} does not exist, the model has n_layers={self.args.n_layers}")
        return layer

    def _block(self, fqn: str) -> tuple[int, int, str] | None:
        """(Hugging Face layer, the layer whose kind the block has, our name within the block) of a block tensor:
        `layers.<i>.<name>`, or `mtp.<k>.block.<name>` (Hugging Face's layer n_layers + k - 1, the kind of the
        last block); None for any other name."""
        match = _OUR_LAYER_KEY.fullmatch(fqn)
        if match:
            layer = self._layer(match, fqn)
            return layer, layer, match.group(2)
        match = _OUR_MTP_KEY.fullmatch(fqn)
        if match and match.group(2).startswith("block."):
            return self._mtp_layer(int(match.group(1)), fqn), self.args.n_layers - 1, match.group(2)[len("block.") :]
        return None

    def _mtp_layer(self, depth: int, key: str) -> int:
        if not 1 <= depth <= self.args.mtp_layers:
            raise ValueError(
                f"{key!r}: MTP module {depth} does not exist, the model has mtp_layers={self.args.mtp_layers}"
            )
        return self.args.n_layers + depth - 1

    def _layer_names(self, layer: int) -> dict[str, str]:
        """Our names within block `layer` -> Hugging Face's within model.layers.<layer>, expert weights aside."""
        names = dict(_PER_LAYER)
        if self.args.qk_norm:
            names.update(_QK_NORM)
        if not self.args.is_sparse(layer):
            names.update(_DENSE_MLP)
        elif self.args.moe.num_shared_experts:
            names.update(_SPARSE_MLP)
        else:
            names["feed_forward.router.gate.weight"] = _SPARSE_MLP["feed_forward.router.gate.weight"]
        return names

    def stacked_hf_keys(self, fqn: str) -> list[str] | None:
        """The Hugging Face keys (one per expert, in expert order) whose tensors, each through from_hf_tensor,
        stack on a new first dimension into our tensor `fqn`; None for a tensor that maps one to one."""
        block = self._block(fqn)
        if block is None or block[2] not in _EXPERTS:
            return None
        layer, kind, rest = block
        if not self.args.is_sparse(kind):
            raise ValueError(f"{fqn!r}: layer {layer} is dense, it has no experts")
        name = _EXPERTS[rest]
        return [f"model.layers.{layer}.mlp.experts.{e}.{name}" for e in range(self.args.moe.num_experts)]

    def to_hf_key(self, fqn: str) -> str:
        if fqn in _TOP_LEVEL:
            return _TOP_LEVEL[fqn]
        mtp = _OUR_MTP_KEY.fullmatch(fqn)
        if mtp and mtp.group(2) in _MTP_OWN:
            return f"model.layers.{self._mtp_layer(int(mtp.group(1)), fqn)}.{mtp.group(2)}"
        block = self._block(fqn)
        if block:
            layer, kind, rest = block
            names = self._layer_names(kind)
            if rest in names:
                return f"model.layers.{layer}.{names[rest]}"
            if rest == "feed_forward.router.expert_bias":
                raise ValueError(
                    f"{fqn!r}: {self.architectures[0]} has no per-expert selection bias; a model trained with "
                    "moe.load_balance = 'aux_loss_free' cannot be exported to this Hugging Face architecture"
                )
        raise ValueError(
            f"{fqn!r} is not a {self.family} parameter name (expected e.g. 'layers.0.attention.wq.weight')"
        )

    def from_hf_key(self, hf_key: str) -> str:
        """Our FQN of a Hugging Face tensor; each expert's weight names our stacked 3-D tensor."""
        if hf_key in _TOP_LEVEL_FROM_HF:
            return _TOP_LEVEL_FROM_HF[hf_key]
        match = _HF_LAYER_KEY.fullmatch(hf_key)
        if match:
            layer, rest = int(match.group(1)), match.group(2)
            if self.args.n_layers <= layer < self.args.n_layers + self.args.mtp_layers:
                # An MTP module: its own tensors, then a block of the last block's kind.
                depth = layer - self.args.n_layers + 1
                if rest in _MTP_OWN:
                    return f"mtp.{depth}.{rest}"
                prefix, kind = f"mtp.{depth}.block.", self.args.n_layers - 1
            else:
                prefix, kind = f"layers.{self._layer(match, hf_key)}.", layer
            ours = {hf: name for name, hf in self._layer_names(kind).items()}
            if rest in ours:
                return prefix + ours[rest]
            expert = _HF_EXPERT_KEY.fullmatch(rest)
            stacked = {hf: name for name, hf in _EXPERTS.items()}
            if expert and self.args.is_sparse(kind) and expert.group(2) in stacked:
                if int(expert.group(1)) >= self.args.moe.num_experts:
                    raise ValueError(f"{hf_key!r}: the model has num_experts={self.args.moe.num_experts}")
                return prefix + stacked[expert.group(2)]
        raise ValueError(
            f"{hf_key!r} is not a {self.architectures[0]} parameter name of this model "
            f"(expected e.g. 'model.layers.0.self_attn.q_proj.weight')"
        )

    def _rotary_heads(self, fqn: str) -> int | None:
        """Heads whose rows need the rotary permutation, or None for tensors that map unchanged. A q/k norm's
        weight is one head's vector: its elements follow the same pairing."""
        if fqn.endswith("attention.wq.weight"):
            return self.args.n_heads
        if fqn.endswith("attention.wk.weight"):
            return self.args.num_kv_heads
        if fqn.endswith(("attention.q_norm.weight", "attention.k_norm.weight")):
            return 1
        return None

    def to_hf_tensor(self, fqn: str, tensor: torch.Tensor) -> torch.Tensor:
        """Our tensor `fqn` (for a stacked expert weight: one expert's slice) in Hugging Face's layout."""
        return self._relayout(fqn, tensor, _interleaved_to_halves)

    def from_hf_tensor(self, hf_key: str, tensor: torch.Tensor) -> torch.Tensor:
        return self._relayout(self.from_hf_key(hf_key), tensor, _halves_to_interleaved)

    def _relayout(self, fqn: str, tensor: torch.Tensor, permute_rope_rows) -> torch.Tensor:
        """`tensor` of `fqn` in the other layout: an expert's slice transposed, a query/key weight's rotary rows
        permuted (`permute_rope_rows`: one direction or the other), anything else as it is."""
        if self.stacked_hf_keys(fqn) is not None:
            return tensor.t()
        n_heads = self._rotary_heads(fqn)
        if n_heads is None:
            return tensor
        flat = tensor.reshape(tensor.shape[0], -1)
        return permute_rope_rows(flat, n_heads, self._rope_dim()).reshape(tensor.shape)

    def _rope_dim(self) -> int:
        """Rows RoPE turns in each head of a permuted tensor, its first ones: the whole query/key head, or its first
        part under partial RoPE (Qwen3-Next); a gated query head's gate rows follow them, unpermuted."""
        return self.args.rope_head_dim

    def to_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Our tensors in Hugging Face's names and layout (hf_copies() are the exporter's to add)."""
        aliases, out = self.aliases(), {}
        for fqn, tensor in state_dict.items():
            if fqn in aliases:
                continue
            stacked = self.stacked_hf_keys(fqn)
            if stacked is None:
                out[self.to_hf_key(fqn)] = self.to_hf_tensor(fqn, tensor)
            else:
                out.update({key: self.to_hf_tensor(fqn, piece) for key, piece in zip(stacked, tensor, strict=True)})
        return out

    def from_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        ours, pieces = {}, {}
        for key, tensor in state_dict.items():
            if self.skips_hf_key(key):
                continue
            fqn = self.from_hf_key(key)
            if self.stacked_hf_keys(fqn) is None:
                ours[fqn] = self.from_hf_tensor(key, tensor)
            else:
                pieces.setdefault(fqn, {})[key] = self.from_hf_tensor(key, tensor)
        for fqn, by_key in pieces.items():
            ours[fqn] = torch.stack([by_key[key] for key in self.stacked_hf_keys(fqn)])
        if self.args.tie_word_embeddings and "lm_head.weight" in state_dict:
            # Some tied folders also store lm_head.weight; it must be the embedding, or the model is untied.
            if not torch.equal(state_dict["lm_head.weight"], state_dict["model.embed_tokens.weight"]):
                raise ValueError("tie_word_embeddings=true but lm_head.weight differs from model.embed_tokens.weight")
        ours.update({alias: ours[source] for alias, source in self.aliases().items()})
        return ours

    def hf_keys(self) -> list[str]:
        """Every tensor name a complete Hugging Face checkpoint of this shape holds (hf_copies() aside: an
        export writes them, an import does without them)."""
        per_layer = []
        for layer in range(self.args.n_layers):
            per_layer += [f"model.layers.{layer}.{name}" for name in self._layer_names(layer).values()]
            if self.args.is_sparse(layer):
                for fqn in _EXPERTS:
                    per_layer += self.stacked_hf_keys(f"layers.{layer}.{fqn}")
        kind = self.args.n_layers - 1
        for depth in range(1, self.args.mtp_layers + 1):
            layer = self.args.n_layers + depth - 1
            per_layer += [f"model.layers.{layer}.{name}" for name in (*self._layer_names(kind).values(), *_MTP_OWN)]
            if self.args.is_sparse(kind):
                for fqn in _EXPERTS:
                    per_layer += self.stacked_hf_keys(f"mtp.{depth}.block.{fqn}")
        head = [] if self.args.tie_word_embeddings else ["lm_head.weight"]
        return ["model.embed_tokens.weight", *per_layer, "model.norm.weight", *head]
