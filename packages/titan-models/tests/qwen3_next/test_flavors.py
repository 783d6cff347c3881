"""Qwen3-Next's flavors: the published size's parameter counts (the model card: 80B total, 79B non-embedding, 3B
active), the shape count_params describes being the model's own, the published config.json read as the 80B-A3B
flavor and written back as transformers reads it, the registry entry, its plan (TP and CP refused) and the
validation of the variations' fields."""

import dataclasses

import pytest
import torch

from titan_models import get_model_spec, list_models
from titan_models.decoder import Decoder, DecoderArgs
from titan_models.decoder.flops import count_params, flops_per_token, num_params
from titan_models.linear_attention import GatedDeltaNetArgs
from titan_models.qwen3_next import FLAVORS, Qwen3NextHFAdapter, args_from_hf_config

# Qwen/Qwen3-Next-80B-A3B-Instruct's config.json on the Hugging Face Hub (the keys that give the shape); it names no
# layer_types: transformers derives them from full_attention_interval.
PUBLISHED_CONFIG = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "attention_bias": False,
    "decoder_sparse_step": 1, "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 5120, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_value_head_dim": 128, "max_position_embeddings": 262144,
    "mlp_only_layers": [], "moe_intermediate_size": 512, "norm_topk_prob": True, "num_attention_heads": 16,
    "num_experts": 512, "num_experts_per_tok": 10, "num_hidden_layers": 48, "num_key_value_heads": 2,
    "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000000,
    "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 512, "tie_word_embeddings": False,
    "use_sliding_window": False, "vocab_size": 151936,
}  # fmt: skip


def test_the_published_size_has_the_published_parameter_counts():
    """80B total and 79B without the embedding, within 0.5%. Active is published to one significant digit ("3B");
    the non-embedding active count (neither the embedding lookup nor the head: 3.25B) rounds to it, as Qwen3-30B-A3B's
    3.3B gives its "A3B". (With the head, count_params(active=True) is 3.56B.)"""
    args = FLAVORS["80B-A3B"]
    assert count_params(args, exclude_embedding=False) == pytest.approx(80e9, rel=0.005)
    assert count_params(args) == pytest.approx(79e9, rel=0.005)
    head = args.vocab_size * args.dim
    assert round((count_params(args, active=True) - head) / 1e9) == 3


@pytest.mark.parametrize("flavor", ["tiny", "debug", "80B-A3B"])
def test_count_params_is_the_models_own_count(flavor):
    """Linear-attention layers, the output-gated wq and the shared-expert gates included: count_params from the
    shape equals the parameters Decoder(args) holds."""
    with torch.device("meta"):
        model = Decoder(FLAVORS[flavor])
    assert count_params(FLAVORS[flavor], exclude_embedding=False) == num_params(model, exclude_embedding=False)


def test_linear_attention_layers_count_no_attended_keys():
    """Per token, a Gated DeltaNet layer's work does not grow with the sequence, a full-attention layer's does."""
    args = FLAVORS["debug"]
    growth = flops_per_token(args, 4096) - flops_per_token(args, 2048)
    full_layers = args.layer_types.count("full_attention")
    assert growth == 6 * args.n_heads * 2 * args.head_dim * 2048 * full_layers


def test_the_published_config_reads_as_the_80B_A3B_flavor():
    assert args_from_hf_config(PUBLISHED_CONFIG) == FLAVORS["80B-A3B"]


@pytest.mark.parametrize("flavor", list(FLAVORS))
def test_config_round_trip_keeps_the_shape(flavor):
    config = Qwen3NextHFAdapter(FLAVORS[flavor]).hf_config()
    assert config["architectures"] == ["Qwen3NextForCausalLM"]
    assert Qwen3NextHFAdapter.from_hf_config(config).args == FLAVORS[flavor]


def test_transformers_reads_our_config_as_the_published_one():
    import transformers

    ours = transformers.Qwen3NextConfig(**Qwen3NextHFAdapter(FLAVORS["80B-A3B"]).hf_config())
    published = transformers.Qwen3NextConfig(**PUBLISHED_CONFIG)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "layer_types", "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                "linear_num_key_heads", "linear_num_value_heads", "num_experts", "num_experts_per_tok",
                "moe_intermediate_size", "shared_expert_intermediate_size", "norm_topk_prob", "mlp_only_layers",
                "vocab_size", "rms_norm_eps", "tie_word_embeddings", "max_position_embeddings"):  # fmt: skip
        assert getattr(ours, key) == getattr(published, key), key
    for key in ("rope_theta", "partial_rotary_factor"):
        assert ours.rope_parameters[key] == published.rope_parameters[key], key


def test_registered_with_its_plan_flops_and_adapter():
    assert "qwen3_next" in list_models()
    spec = get_model_spec("qwen3_next")
    args = spec.args_for("debug")
    assert spec.flops_per_token(args, 2048) > 0
    plan = spec.plan(args)
    assert plan.block_fqns == [f"layers.{i}" for i in range(args.n_layers)]
    assert plan.expert_fqns == ["layers.*.feed_forward.experts"]
    assert plan.context_parallel  # ring attention on full-attention layers, linear_attention_cp on the others
    assert {"layers.*.linear_attn.short_conv", "layers.*.linear_attn.delta_rule"} <= set(plan.attention_fqns)
    tp_plan = plan.tp_plan(loss_parallel=True)  # entries: tests/decoder/test_linear_attention_tp_plan.py
    assert "layers.0.linear_attn.conv1d" in tp_plan and "layers.3.attention.wq" in tp_plan
    adapter = spec.hf_adapter(args)
    assert (
        adapter.to_hf_key("layers.0.linear_attn.in_proj_qkvz.weight")
        == "model.layers.0.linear_attn.in_proj_qkvz.weight"
    )
    assert adapter.to_hf_key("layers.3.attention.wq.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert adapter.from_hf_key("model.layers.1.mlp.shared_expert_gate.weight") == (
        "layers.1.feed_forward.shared_expert_gate.weight"
    )
    assert adapter.to_hf_key("layers.2.feed_forward.shared_experts.w2.weight") == (
        "model.layers.2.mlp.shared_expert.down_proj.weight"
    )
    with pytest.raises(ValueError, match="not a Qwen3NextForCausalLM parameter name"):
        adapter.from_hf_key("model.layers.0.self_attn.q_proj.weight")  # layer 0 is linear attention
    assert adapter.skips_hf_key("mtp.layers.0.mlp.gate.weight")


def test_init_draws_zero_centred_norms_at_zero():
    """Every decoder RMSNorm starts as the identity scale (1 + 0); the Gated DeltaNet's output norm at weight 1."""
    model = Decoder(FLAVORS["tiny"])
    model.init_weights(seed=0)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            expected = 1.0 if "linear_attn" in name else 0.0
            assert torch.equal(param, torch.full_like(param, expected)), name


TINY = FLAVORS["tiny"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(linear_attention=None), r"layer_types\[0\]='linear_attention' needs Llama3Args.linear_attention"),
        (dict(linear_attention=GatedDeltaNetArgs(dim=32)), r"linear_attention.dim=32 differs from Llama3Args.dim=64"),
        (dict(partial_rotary_factor=0.0), r"partial_rotary_factor=0.0 must be in \(0, 1\]"),
        (dict(partial_rotary_factor=0.1), r"partial_rotary_factor=0.1 rotates 3 of head_dim=32 channels"),
        (dict(attention_output_gate=1), r"attention_output_gate=1 must be true or false"),
        (dict(mtp_layers=1), r"mtp_layers=1: multi-token prediction modules are not built for linear-attention"),
        (
            dict(moe=dataclasses.replace(TINY.moe, num_shared_experts=0)),
            r"shared_expert_gate=True gates the shared experts, but num_shared_experts=0",
        ),
    ],
)
def test_validation_names_field_value_and_fix(changes, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TINY, **changes).validate()


def test_a_plain_decoder_is_unchanged_by_the_new_fields():
    """Defaults off: the decoder args of the other families build the same modules and parameter names."""
    args = DecoderArgs(dim=64, n_layers=2, n_heads=4, vocab_size=128, multiple_of=16)
    model = Decoder(args)
    assert all(layer.linear_attn is None for layer in model.layers.values())
    assert model.layers["0"].attention.wq.weight.shape == (64, 64)
    assert not any(name.endswith("shared_expert_gate.weight") for name, _ in model.named_parameters())


def test_args_round_trip_through_checkpoint_metadata():
    """args_dict (plain data in a checkpoint's metadata) reads back with its GatedDeltaNetArgs and gated MoEArgs."""
    adapter = Qwen3NextHFAdapter(FLAVORS["debug"])
    back = Qwen3NextHFAdapter.from_args_dict(adapter.args_dict()).args
    assert isinstance(back.linear_attention, GatedDeltaNetArgs) and back.moe.shared_expert_gate
    assert back == FLAVORS["debug"]
