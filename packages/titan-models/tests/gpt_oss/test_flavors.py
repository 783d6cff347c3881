"""GPT-OSS's flavors: the published sizes' parameter counts (OpenAI's model card: 20.9B total / 3.6B active, 116.8B /
5.1B), the shape count_params describes being the model's own, the published config.json keys both ways, GPT-OSS's
YaRN frequencies against transformers', the registry and the adapter's names."""

import dataclasses
import math

import pytest
import torch

from titan_models import get_model_spec, list_models
from titan_models.decoder import Decoder
from titan_models.decoder.flops import count_params, num_params
from titan_models.decoder.rope import precompute_freqs_cis
from titan_models.gpt_oss import FLAVORS, GptOssHFAdapter, args_from_hf_config

# OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (Aug 2025): total and active parameters per token. Active counts
# the unembedding but not the embedding lookup, as count_params(active=True) does; totals within 0.5%.
PUBLISHED = {"20B": (20.9e9, 3.6e9), "120B": (116.8e9, 5.1e9)}


@pytest.mark.parametrize("flavor", list(PUBLISHED))
def test_published_flavors_have_the_published_parameter_counts(flavor):
    total, active = PUBLISHED[flavor]
    args = FLAVORS[flavor]
    assert count_params(args, exclude_embedding=False) == pytest.approx(total, rel=0.005)
    # Active is published to one decimal (the 120B counts 5.133B): within the rounding of that digit.
    assert count_params(args, active=True) == pytest.approx(active, abs=0.05e9)


@pytest.mark.parametrize("flavor", ["tiny", "debug", "20B"])
def test_count_params_is_the_models_own_count(flavor):
    """Biases and sinks included: count_params from the shape equals the parameters Decoder(args) holds."""
    with torch.device("meta"):
        model = Decoder(FLAVORS[flavor])
    assert count_params(FLAVORS[flavor], exclude_embedding=False) == num_params(model, exclude_embedding=False)


# openai/gpt-oss-20b's config.json on the Hugging Face Hub (the keys that give the shape).
PUBLISHED_20B_CONFIG = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True, "head_dim": 64,
    "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12, "max_position_embeddings": 131072,
    "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "rms_norm_eps": 1e-05, "rope_theta": 150000,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": False,
    "vocab_size": 201088,
}  # fmt: skip


def test_the_published_config_reads_as_the_20B_flavor():
    args = args_from_hf_config(PUBLISHED_20B_CONFIG)
    assert args.moe.aux_loss_coef == 0.9  # router_aux_loss_coef -> moe.aux_loss_coef
    assert dataclasses.replace(args, moe=dataclasses.replace(args.moe, aux_loss_coef=0.001)) == FLAVORS["20B"]


@pytest.mark.parametrize("flavor", list(FLAVORS))
def test_config_round_trip_keeps_the_shape(flavor):
    config = GptOssHFAdapter(FLAVORS[flavor]).hf_config()
    assert config["architectures"] == ["GptOssForCausalLM"]
    assert GptOssHFAdapter.from_hf_config(config).args == FLAVORS[flavor]


def test_transformers_reads_our_config_as_the_published_one():
    import transformers

    ours = transformers.GptOssConfig(**GptOssHFAdapter(FLAVORS["120B"]).hf_config())
    defaults = transformers.GptOssConfig()  # GptOssConfig's defaults are gpt-oss-120b's
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "num_local_experts", "num_experts_per_tok", "vocab_size", "sliding_window", "layer_types",
                "rms_norm_eps", "swiglu_limit", "attention_bias", "tie_word_embeddings", "max_position_embeddings",
                "rope_parameters"):  # fmt: skip
        assert getattr(ours, key) == getattr(defaults, key), key


def test_yarn_frequencies_are_transformers_untruncated_ones():
    """GPT-OSS's YaRN (truncate false, attention factor mscale(32)) gives transformers' cos / sin; truncating the
    ramp's ends, Hugging Face's default and DeepSeek-V3's, would not."""
    import transformers
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    args = FLAVORS["20B"]
    rotary = GptOssRotaryEmbedding(transformers.GptOssConfig(**GptOssHFAdapter(args).hf_config()))
    positions = torch.arange(4096)[None]
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions)
    assert rotary.attention_scaling == pytest.approx(0.1 * math.log(32) + 1)
    ours = precompute_freqs_cis(args.head_dim, 4096, args.rope_theta, args.rope_scaling)
    torch.testing.assert_close(ours.real, cos[0], atol=1e-4, rtol=0)
    torch.testing.assert_close(ours.imag, sin[0], atol=1e-4, rtol=0)
    truncated = dataclasses.replace(args.rope_scaling, truncate=True)
    assert (precompute_freqs_cis(args.head_dim, 4096, args.rope_theta, truncated).real - cos[0]).abs().max() > 1e-2


def test_registered_with_its_plan_flops_and_adapter():
    assert "gpt_oss" in list_models()
    spec = get_model_spec("gpt_oss")
    args = spec.args_for("debug")
    assert spec.flops_per_token(args, 2048) > 0
    adapter = spec.hf_adapter(args)
    assert adapter.to_hf_key("layers.1.attention.sinks") == "model.layers.1.self_attn.sinks"
    assert adapter.to_hf_key("layers.0.attention.wk.bias") == "model.layers.0.self_attn.k_proj.bias"
    assert adapter.to_hf_key("layers.0.feed_forward.router.gate.bias") == "model.layers.0.mlp.router.bias"
    assert adapter.from_hf_key("model.layers.2.mlp.experts.down_proj_bias") == "layers.2.feed_forward.experts.w2_bias"
    assert adapter.fused_hf_keys()["model.layers.3.mlp.experts.gate_up_proj"] == (
        "layers.3.feed_forward.experts.w1",
        "layers.3.feed_forward.experts.w3",
    )
    with pytest.raises(ValueError, match="gate_up_proj interleaves"):
        adapter.to_hf_key("layers.0.feed_forward.experts.w1")
    with pytest.raises(ValueError, match="gate_up_proj interleaves"):
        adapter.from_hf_key("model.layers.0.mlp.experts.gate_up_proj_bias")


def test_q_and_k_biases_follow_their_rows_rotary_permutation():
    adapter = GptOssHFAdapter(FLAVORS["tiny"])
    weight, bias = torch.randn(4 * 16, 64), torch.randn(4 * 16)
    hf_weight = adapter.to_hf_tensor("layers.0.attention.wq.weight", weight)
    hf_bias = adapter.to_hf_tensor("layers.0.attention.wq.bias", bias)
    assert not torch.equal(hf_bias, bias)
    # Row r of the weight and element r of the bias move together.
    rows = [int(torch.nonzero((hf_weight == weight[r]).all(-1))) for r in range(len(bias))]
    torch.testing.assert_close(hf_bias[rows], bias, rtol=0, atol=0)
    torch.testing.assert_close(adapter.from_hf_tensor("model.layers.0.self_attn.q_proj.bias", hf_bias), bias)


def test_other_families_settings_are_refused_with_the_field_named():
    args = FLAVORS["tiny"]
    with pytest.raises(ValueError, match="attention_sinks"):
        GptOssHFAdapter(dataclasses.replace(args, attention_sinks=False))
    with pytest.raises(ValueError, match="expert_activation"):
        GptOssHFAdapter(dataclasses.replace(args, moe=dataclasses.replace(args.moe, expert_activation="swiglu")))
    with pytest.raises(ValueError, match="GptOssForCausalLM"):
        GptOssHFAdapter.from_hf_config({"architectures": ["Qwen3MoeForCausalLM"]})


def test_checkpoint_metadata_round_trip_keeps_the_yarn_truncation_and_layer_types():
    """How titan-checkpoint stores the args (plain data) and reads them back."""
    adapter = GptOssHFAdapter(FLAVORS["20B"])
    back = GptOssHFAdapter.from_args_dict(adapter.args_dict()).args
    assert back == FLAVORS["20B"] and back.rope_scaling.truncate is False
