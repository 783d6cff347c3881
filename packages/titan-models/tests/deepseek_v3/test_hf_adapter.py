"""DeepSeek-V3 names and config.json, ours <-> Hugging Face, without transformers (the integration suite
compares against transformers itself: integration/test_deepseek_v3_hf.py)."""

import dataclasses

import pytest
import torch

from titan_models import get_model_spec
from titan_models.deepseek_v3 import DeepseekV3HFAdapter


def random_state(flavor="tiny", **changes):
    spec = get_model_spec("deepseek_v3")
    args = dataclasses.replace(spec.args_for(flavor), **changes)
    model = spec.model_cls(args)
    model.init_weights(seed=0)
    with torch.no_grad():
        for layer in model.moe_layers().values():
            layer.router.expert_bias.uniform_(-1, 1)
    return args, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_every_tensor_maps_to_hugging_face_and_back_unchanged():
    args, state = random_state()
    adapter = DeepseekV3HFAdapter(args)
    hf = adapter.to_hf(state)
    assert sorted(hf) == sorted(adapter.hf_keys())
    assert "model.layers.0.mlp.gate_proj.weight" in hf  # first_k_dense_replace = 1
    assert "model.layers.1.self_attn.q_a_layernorm.weight" in hf and "model.layers.1.self_attn.q_proj.weight" not in hf
    bias = state["layers.1.feed_forward.router.expert_bias"]
    torch.testing.assert_close(hf["model.layers.1.mlp.gate.e_score_correction_bias"], bias)
    # No rotary permutation: DeepSeek's rotary rows are interleaved pairs, as ours.
    torch.testing.assert_close(hf["model.layers.1.self_attn.kv_a_proj_with_mqa.weight"],
                               state["layers.1.attention.wkv_a.weight"])  # fmt: skip
    back = adapter.from_hf(hf)
    assert sorted(back) == sorted(state)
    for key in state:
        torch.testing.assert_close(back[key], state[key], rtol=0, atol=0, msg=key)


def test_direct_queries_map_to_q_proj():
    args, state = random_state(mla=dataclasses.replace(get_model_spec("deepseek_v3").args_for("tiny").mla,
                                                       q_lora_rank=None))  # fmt: skip
    hf = DeepseekV3HFAdapter(args).to_hf(state)
    assert "model.layers.0.self_attn.q_proj.weight" in hf and "model.layers.0.self_attn.q_a_proj.weight" not in hf


def test_config_round_trip_keeps_the_shape():
    for flavor in ("tiny", "671B"):
        args = get_model_spec("deepseek_v3").args_for(flavor)
        config = DeepseekV3HFAdapter(args).hf_config()
        assert config["architectures"] == ["DeepseekV3ForCausalLM"] and config["rope_interleave"] is True
        assert DeepseekV3HFAdapter.from_hf_config(config).args == args
    config = DeepseekV3HFAdapter(get_model_spec("deepseek_v3").args_for("671B")).hf_config()
    assert (config["n_group"], config["topk_group"], config["first_k_dense_replace"]) == (8, 4, 3)
    assert config["rope_parameters"]["rope_type"] == "yarn" and config["rope_parameters"]["factor"] == 40.0


def test_softmax_routing_has_no_deepseek_v3_config():
    # The 16B is DeepSeek-V2-Lite's routing (softmax), which DeepseekV3ForCausalLM cannot express.
    with pytest.raises(ValueError, match="DeepSeek-V3 routes by sigmoid"):
        DeepseekV3HFAdapter(get_model_spec("deepseek_v3").args_for("16B")).hf_config()


def test_a_llama_config_is_not_read_as_deepseek():
    with pytest.raises(ValueError, match="DeepseekV3ForCausalLM"):
        DeepseekV3HFAdapter.from_hf_config({"architectures": ["LlamaForCausalLM"]})
