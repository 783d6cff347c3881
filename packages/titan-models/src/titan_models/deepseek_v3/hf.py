"""DeepSeek-V3 <-> Hugging Face DeepseekV3ForCausalLM: the decoder's mapping (embeddings, norms, dense and
sparse feed-forward, experts one tensor per expert) with MLA's attention names, the shared experts and the
selection bias (`e_score_correction_bias`: our auxiliary-loss-free `expert_bias`). No rotary permutation:
DeepSeek's rotary weights are interleaved pairs, as ours are."""

from __future__ import annotations

from titan_models.decoder.hf import DecoderHFAdapter
from titan_models.deepseek_v3.flavors import FLAVORS
from titan_models.deepseek_v3.hf_config import ARCHITECTURE, args_from_hf_config, hf_config

_ATTENTION = {
    "attention.wkv_a.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attention.kv_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attention.wkv_b.weight": "self_attn.kv_b_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_QUERY_DIRECT = {"attention.wq.weight": "self_attn.q_proj.weight"}
_QUERY_LATENT = {
    "attention.wq_a.weight": "self_attn.q_a_proj.weight",
    "attention.q_norm.weight": "self_attn.q_a_layernorm.weight",
    "attention.wq_b.weight": "self_attn.q_b_proj.weight",
}
_DENSE_MLP = {
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
}
_ROUTER = {"feed_forward.router.gate.weight": "mlp.gate.weight"}
_SELECTION_BIAS = {"feed_forward.router.expert_bias": "mlp.gate.e_score_correction_bias"}
_SHARED = {
    "feed_forward.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "feed_forward.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
    "feed_forward.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
}


class DeepseekV3HFAdapter(DecoderHFAdapter):
    architectures = (ARCHITECTURE,)
    flavors = FLAVORS
    family = "DeepSeek-V3"
    config_to_args = staticmethod(args_from_hf_config)
    args_to_config = staticmethod(hf_config)

    def _layer_names(self, layer: int) -> dict[str, str]:
        args = self.args
        names = {**_ATTENTION, **(_QUERY_DIRECT if args.mla.q_lora_rank is None else _QUERY_LATENT)}
        if not args.is_sparse(layer):
            return {**names, **_DENSE_MLP}
        names.update(_ROUTER)
        if args.moe.load_balance == "aux_loss_free":  # the bias is in our state dict only then
            names.update(_SELECTION_BIAS)
        if args.moe.num_shared_experts:
            names.update(_SHARED)
        return names

    def _rotary_heads(self, fqn: str) -> int | None:
        return None
