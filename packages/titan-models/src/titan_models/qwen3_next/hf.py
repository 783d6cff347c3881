"""Qwen3-Next <-> Hugging Face Qwen3NextForCausalLM: the decoder's tensor names (Llama's, q/k norms and experts
included) in the full-attention layers, the Gated DeltaNet's own names (already Hugging Face's) in the
linear-attention ones, and the sparse layers' single shared expert and its gate:

    layers.N.linear_attn.{in_proj_qkvz,in_proj_ba,conv1d,out_proj}.weight, .A_log, .dt_bias, .norm.weight
        <-> model.layers.N.linear_attn.* (same names, shapes and layouts)
    layers.N.attention.wq.weight  <-> model.layers.N.self_attn.q_proj.weight  ([query | gate] rows per head; the
        query's first rope_head_dim rows of each head permuted between RoPE layouts, the gate's left alone)
    layers.N.feed_forward.shared_experts.w{1,3,2}.weight <-> model.layers.N.mlp.shared_expert.{gate,up,down}_proj.weight
    layers.N.feed_forward.shared_expert_gate.weight      <-> model.layers.N.mlp.shared_expert_gate.weight

Norm weights map unchanged: ours and Hugging Face's are both the zero-centred offset (scale = 1 + weight). The
published folders' MTP layer (mtp.*) is not read: transformers ignores it too."""

from __future__ import annotations

from titan_models.decoder.hf import DecoderHFAdapter
from titan_models.qwen3_next.flavors import FLAVORS
from titan_models.qwen3_next.hf_config import ARCHITECTURE, args_from_hf_config, hf_config

_LINEAR_ATTENTION_NAMES = ("in_proj_qkvz.weight", "in_proj_ba.weight", "conv1d.weight", "A_log", "dt_bias",
                           "norm.weight", "out_proj.weight")  # fmt: skip
_LINEAR_ATTENTION = {f"linear_attn.{name}": f"linear_attn.{name}" for name in _LINEAR_ATTENTION_NAMES}
_SHARED_EXPERT = {
    "feed_forward.shared_experts.w1.weight": "mlp.shared_expert.gate_proj.weight",
    "feed_forward.shared_experts.w3.weight": "mlp.shared_expert.up_proj.weight",
    "feed_forward.shared_experts.w2.weight": "mlp.shared_expert.down_proj.weight",
    "feed_forward.shared_expert_gate.weight": "mlp.shared_expert_gate.weight",
}


class Qwen3NextHFAdapter(DecoderHFAdapter):
    architectures = (ARCHITECTURE,)
    flavors = FLAVORS
    family = "Qwen3-Next"
    config_to_args = staticmethod(args_from_hf_config)
    args_to_config = staticmethod(hf_config)

    def _layer_names(self, layer: int) -> dict[str, str]:
        names = super()._layer_names(layer)
        if self.args.is_linear_attention(layer):
            names = {ours: hf for ours, hf in names.items() if not ours.startswith("attention.")}
            names.update(_LINEAR_ATTENTION)
        if self.args.is_sparse(layer):
            names = {ours: hf for ours, hf in names.items() if not ours.startswith("feed_forward.shared_experts.")}
            names.update(_SHARED_EXPERT)
        return names

    def skips_hf_key(self, hf_key: str) -> bool:
        """Also the published folders' multi-token prediction layer (mtp.*), which this model does not build."""
        return hf_key.startswith("mtp.") or super().skips_hf_key(hf_key)
