"""Qwen3 / Qwen3-MoE names and config.json, ours <-> Hugging Face, without transformers (the integration
suite compares against transformers itself)."""

import pytest
import torch

from titan_models import get_model_spec
from titan_models.qwen3 import Qwen3HFAdapter
from titan_models.qwen3_moe import Qwen3MoeHFAdapter


def random_state(name, flavor):
    args = get_model_spec(name).args_for(flavor)
    model = get_model_spec(name).model_cls(args)
    model.init_weights(seed=0)
    return args, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_experts_export_one_tensor_per_expert_and_stack_back():
    args, state = random_state("qwen3_moe", "tiny")
    adapter = Qwen3MoeHFAdapter(args)
    hf = adapter.to_hf(state)
    assert sorted(hf) == sorted(adapter.hf_keys())
    assert "model.layers.0.mlp.gate_proj.weight" in hf  # layer 0 is dense (mlp_only_layers)
    w1 = state["layers.1.feed_forward.experts.w1"]
    assert w1.shape == (8, 64, 32)
    torch.testing.assert_close(hf["model.layers.1.mlp.experts.5.gate_proj.weight"], w1[5].t())
    assert hf["model.layers.1.mlp.gate.weight"].shape == (8, 64)
    back = adapter.from_hf(hf)
    assert sorted(back) == sorted(state)
    for key in state:
        torch.testing.assert_close(back[key], state[key], rtol=0, atol=0, msg=key)


def test_config_round_trip_keeps_the_shape():
    for cls, name, flavor in ((Qwen3HFAdapter, "qwen3", "tiny"), (Qwen3MoeHFAdapter, "qwen3_moe", "tiny-sparse2")):
        args = get_model_spec(name).args_for(flavor)
        config = cls(args).hf_config()
        assert config["architectures"] == list(cls.architectures)
        assert cls.from_hf_config(config).args == args


def test_moe_config_keys_are_qwen3_moes():
    config = Qwen3MoeHFAdapter(get_model_spec("qwen3_moe").args_for("30B-A3B")).hf_config()
    assert (config["num_experts"], config["num_experts_per_tok"], config["moe_intermediate_size"]) == (128, 8, 768)
    assert config["norm_topk_prob"] is True and config["head_dim"] == 128 and config["mlp_only_layers"] == []


def test_an_aux_loss_free_model_refuses_an_export_that_would_drop_its_bias():
    import dataclasses

    args = get_model_spec("qwen3_moe").args_for("tiny")
    args = dataclasses.replace(args, moe=dataclasses.replace(args.moe, load_balance="aux_loss_free"))
    with pytest.raises(ValueError, match="aux_loss_free"):
        Qwen3MoeHFAdapter(args).to_hf_key("layers.1.feed_forward.router.expert_bias")


def test_a_llama_config_is_not_read_as_qwen3():
    with pytest.raises(ValueError, match="Qwen3ForCausalLM"):
        Qwen3HFAdapter.from_hf_config({"architectures": ["LlamaForCausalLM"]})
