"""GPT-OSS <-> Hugging Face GptOssForCausalLM: Llama's names (decoder/hf.py) with GPT-OSS's additions, the
projection biases, self_attn.sinks, mlp.router.{weight,bias}, and the experts as 3-D tensors per layer.

Hugging Face keeps each layer's experts fused: mlp.experts.gate_up_proj [experts, dim, 2 * hidden] with gate and up
interleaved (gate the even columns, up the odd ones), gate_up_proj_bias [experts, 2 * hidden], down_proj [experts,
hidden, dim], down_proj_bias [experts, dim]; every matrix (in, out) as ours, so no transpose. down_proj(_bias) maps one
to one onto our w2(_bias); gate_up_proj(_bias) is two of our tensors, w1 and w3 (w1_bias and w3_bias): `fused_hf_keys`
says which, `merge_to_hf` interleaves them, `split_from_hf` de-interleaves. to_hf / from_hf do both; the one-tensor-
at-a-time calls (to_hf_key, from_hf_key) refuse those names rather than write half a tensor.

Rotary layout: GPT-OSS rotates halves (first half with second half), as Llama's rotate_half does, so wq / wk rows
and, with them, the q / k biases are permuted as the Llama adapter permutes them."""

from __future__ import annotations

import re

import torch

from titan_models.decoder.hf import DecoderHFAdapter
from titan_models.gpt_oss.flavors import FLAVORS
from titan_models.gpt_oss.hf_config import ARCHITECTURE, args_from_hf_config, check_gpt_oss, hf_config

_ATTENTION = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "attention.sinks": "self_attn.sinks",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_ATTENTION_BIAS = {
    "attention.wq.bias": "self_attn.q_proj.bias",
    "attention.wk.bias": "self_attn.k_proj.bias",
    "attention.wv.bias": "self_attn.v_proj.bias",
    "attention.wo.bias": "self_attn.o_proj.bias",
}
_MLP = {
    "feed_forward.router.gate.weight": "mlp.router.weight",
    "feed_forward.router.gate.bias": "mlp.router.bias",
    "feed_forward.experts.w2": "mlp.experts.down_proj",
    "feed_forward.experts.w2_bias": "mlp.experts.down_proj_bias",
}
# Hugging Face's fused tensor -> (ours from its even columns: gate, ours from its odd columns: up).
_FUSED = {
    "mlp.experts.gate_up_proj": ("feed_forward.experts.w1", "feed_forward.experts.w3"),
    "mlp.experts.gate_up_proj_bias": ("feed_forward.experts.w1_bias", "feed_forward.experts.w3_bias"),
}
_FUSED_FROM_OURS = {ours: hf for hf, pair in _FUSED.items() for ours in pair}
_HF_LAYER_KEY = re.compile(r"model\.layers\.(\d+)\.(.+)")
_OUR_LAYER_KEY = re.compile(r"layers\.(\d+)\.(.+)")
# Our q / k tensors whose rows follow the rotary pairing, and the heads they hold.
_ROTARY = {"attention.wq.weight": "q", "attention.wq.bias": "q", "attention.wk.weight": "k", "attention.wk.bias": "k"}


class GptOssHFAdapter(DecoderHFAdapter):
    architectures = (ARCHITECTURE,)
    flavors = FLAVORS
    family = "GPT-OSS"
    config_to_args = staticmethod(args_from_hf_config)
    args_to_config = staticmethod(hf_config)

    def __init__(self, args):
        super().__init__(args)
        check_gpt_oss(args)

    def _layer_names(self, layer: int) -> dict[str, str]:
        return {**_ATTENTION, **(_ATTENTION_BIAS if self.args.attention_bias else {}), **_MLP}

    def stacked_hf_keys(self, fqn: str) -> None:
        """None: no tensor of ours stacks per-expert Hugging Face tensors (GPT-OSS's are 3-D already)."""
        return None

    def fused_hf_keys(self) -> dict[str, tuple[str, str]]:
        """{Hugging Face key: (our gate FQN, our up FQN)} for each tensor that interleaves two of ours."""
        return {
            f"model.layers.{layer}.{hf}": (f"layers.{layer}.{gate}", f"layers.{layer}.{up}")
            for layer in range(self.args.n_layers)
            for hf, (gate, up) in _FUSED.items()
        }

    @staticmethod
    def merge_to_hf(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """Our w1 and w3 (or their biases) as Hugging Face's gate_up_proj(_bias): gate and up interleaved."""
        return torch.stack((gate, up), dim=-1).flatten(-2)

    @staticmethod
    def split_from_hf(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Hugging Face's gate_up_proj(_bias) as our (w1, w3) (or their biases)."""
        return gate_up[..., ::2].contiguous(), gate_up[..., 1::2].contiguous()

    def _refuse_fused(self, name: str, rest: str) -> None:
        if rest in _FUSED_FROM_OURS or rest in _FUSED:
            raise ValueError(
                f"{name!r} is half of / holds two tensors (Hugging Face's gate_up_proj interleaves our w1 and w3); "
                "convert it with fused_hf_keys / merge_to_hf / split_from_hf, or the whole-state to_hf / from_hf"
            )

    def to_hf_key(self, fqn: str) -> str:
        match = _OUR_LAYER_KEY.fullmatch(fqn)
        if match:
            self._refuse_fused(fqn, match.group(2))
        return super().to_hf_key(fqn)

    def from_hf_key(self, hf_key: str) -> str:
        match = _HF_LAYER_KEY.fullmatch(hf_key)
        if match:
            self._refuse_fused(hf_key, match.group(2))
        return super().from_hf_key(hf_key)

    def _rotary_heads(self, fqn: str) -> int | None:
        match = _OUR_LAYER_KEY.fullmatch(fqn)
        kind = _ROTARY.get(match.group(2)) if match else None
        if kind is None:
            return None
        return self.args.n_heads if kind == "q" else self.args.num_kv_heads

    def to_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        fused = self.fused_hf_keys()
        halves = {fqn for pair in fused.values() for fqn in pair}
        out = super().to_hf({fqn: t for fqn, t in state_dict.items() if fqn not in halves})
        for hf_key, (gate, up) in fused.items():
            if gate in state_dict or up in state_dict:
                out[hf_key] = self.merge_to_hf(state_dict[gate], state_dict[up])
        return out

    def from_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        fused = self.fused_hf_keys()
        ours = super().from_hf({key: t for key, t in state_dict.items() if key not in fused})
        for hf_key, (gate, up) in fused.items():
            if hf_key in state_dict:
                ours[gate], ours[up] = self.split_from_hf(state_dict[hf_key])
        return ours

    def hf_keys(self) -> list[str]:
        per_layer = []
        for layer in range(self.args.n_layers):
            per_layer += [f"model.layers.{layer}.{name}" for name in self._layer_names(layer).values()]
            per_layer += [f"model.layers.{layer}.{name}" for name in _FUSED]
        head = [] if self.args.tie_word_embeddings else ["lm_head.weight"]
        return ["model.embed_tokens.weight", *per_layer, "model.norm.weight", *head]
