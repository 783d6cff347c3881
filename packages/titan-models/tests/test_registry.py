import pytest

import titan_models
from titan_models import ModelPlan, get_model_spec, list_models


def test_llama3_is_registered():
    spec = get_model_spec("llama3")
    assert "llama3" in list_models()
    args = spec.args_for("debug")
    assert isinstance(spec.plan(args), ModelPlan)
    assert spec.flops_per_token(args, 2048) > 0
    assert spec.hf_adapter(args).to_hf_key("output.weight") == "lm_head.weight"


def test_args_for_returns_a_copy():
    spec = get_model_spec("llama3")
    spec.args_for("debug").max_seq_len = 1
    assert spec.args_for("debug").max_seq_len == 2048


def test_unknown_model_suggests_a_name():
    with pytest.raises(
        ValueError,
        match=r"model.name='lama3'.*did you mean 'llama3'\?.*valid names: deepseek_v3, gpt_oss, hyena, llama3",
    ):
        get_model_spec("lama3")


def test_unknown_flavor_suggests_a_flavor():
    with pytest.raises(ValueError, match=r"model.flavor='8b'.*did you mean '8B'\?.*valid flavors: tiny, .*debug, .*8B"):
        get_model_spec("llama3").args_for("8b")


def test_installed_version_is_the_package_version():
    from importlib.metadata import version

    assert version("titan-models") == titan_models.__version__
