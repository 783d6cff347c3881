"""Float8Options.validate: every error names the float8.<field>, the bad value and what would work."""

import pytest
import torch

from titan_float8 import Float8Options, convert_to_float8


def test_defaults_are_valid_and_skip_the_output_layer():
    options = Float8Options()
    options.validate()
    assert options.recipe == "tensorwise" and options.filter_fqns == ["output"]


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_both_recipes_are_valid(recipe):
    Float8Options(enable=True, recipe=recipe).validate()


def test_bad_recipe_names_the_field_and_the_choices():
    with pytest.raises(ValueError, match=r"float8.recipe='blockwise' is not supported; use 'tensorwise' or 'rowwise'"):
        Float8Options(recipe="blockwise").validate()


def test_rowwise_with_fsdp_float8_all_gather_is_an_error():
    options = Float8Options(enable=True, recipe="rowwise", enable_fsdp_float8_all_gather=True)
    with pytest.raises(ValueError, match=r"float8.enable_fsdp_float8_all_gather=True needs float8.recipe='tensorwise'"):
        options.validate()


def test_precompute_needs_float8_all_gather():
    with pytest.raises(ValueError, match=r"float8.precompute_float8_dynamic_scale_for_fsdp=True needs"):
        Float8Options(precompute_float8_dynamic_scale_for_fsdp=True).validate()


def test_filter_fqns_must_be_a_list_of_strings():
    with pytest.raises(ValueError, match=r"float8.filter_fqns='output' must be a list"):
        Float8Options(filter_fqns="output").validate()


def test_convert_validates_before_touching_the_model():
    model = torch.nn.Sequential(torch.nn.Linear(16, 16))
    with pytest.raises(ValueError, match="float8.recipe"):
        convert_to_float8(model, Float8Options(enable=True, recipe="delayed"))
    assert type(model[0]) is torch.nn.Linear


def test_gpu_without_fp8_tensor_cores_is_refused_unless_emulated(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    cuda = torch.device("cuda", 0)
    with pytest.raises(ValueError, match=r"capability >= 8.9.*A100.*has 8.0.*float8.emulate=true"):
        Float8Options(enable=True, emulate=False).validate(cuda)  # forced real float8 (the default "auto" emulates)
    Float8Options(enable=True).validate(cuda)
    Float8Options(enable=True, emulate=True).validate(cuda)
    Float8Options(enable=True).validate(torch.device("cpu"))
