"""Which Linear layers convert_to_float8 converts, which it skips and why, and what it leaves unchanged."""

import logging

import pytest
import torch
from torch import nn
from torchao.float8.float8_linear import Float8Linear
from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

from titan_float8 import Float8Options, convert_to_float8

ON = Float8Options(enable=True)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 64)
        self.odd_in = nn.Linear(24, 32)
        self.odd_out = nn.Linear(32, 10)
        self.block = nn.ModuleDict({"w1": nn.Linear(64, 128, bias=False), "w2": nn.Linear(128, 64, bias=False)})
        self.mha = nn.MultiheadAttention(32, 2)  # its out_proj is a Linear subclass used by weight only
        self.output = nn.Linear(64, 48, bias=False)


def kinds(model: nn.Module) -> dict[str, str]:
    return {fqn: type(m).__name__ for fqn, m in model.named_modules() if isinstance(m, nn.Linear)}


def test_converts_eligible_layers_and_says_why_it_skips_the_others():
    model = Net()
    report = convert_to_float8(model, ON)
    assert report.converted == ["proj", "block.w1", "block.w2"]
    assert report.skipped == {
        "odd_in": "in_features=24 not a multiple of 16 (torch._scaled_mm needs it)",
        "odd_out": "out_features=10 not a multiple of 16 (torch._scaled_mm needs it)",
        "mha.out_proj": "NonDynamicallyQuantizableLinear is not a plain nn.Linear",
        "output": "matches float8.filter_fqns entry 'output'",
    }
    assert kinds(model) == {
        "proj": "Float8Linear",
        "odd_in": "Linear",
        "odd_out": "Linear",
        "block.w1": "Float8Linear",
        "block.w2": "Float8Linear",
        "mha.out_proj": "NonDynamicallyQuantizableLinear",
        "output": "Linear",
    }


class Experts(nn.Module):
    """A mixture of experts' stacked weights, as titan_models.moe.GroupedExperts holds them."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(4, 32, 64))


def test_stacked_expert_weights_are_skipped_with_a_reason():
    model = nn.ModuleDict({"proj": nn.Linear(32, 64), "experts": Experts()})
    report = convert_to_float8(model, ON)
    assert report.converted == ["proj"]
    assert report.skipped == {"experts": "3-D expert weights: no float8 grouped matmul here, kept in high precision"}
    assert type(model["experts"]) is Experts


def test_filter_fqns_are_substrings_of_module_names():
    model = Net()
    report = convert_to_float8(model, Float8Options(enable=True, filter_fqns=["block"]))
    assert report.converted == ["proj", "output"]
    assert report.skipped["block.w1"] == report.skipped["block.w2"] == "matches float8.filter_fqns entry 'block'"


def test_names_values_and_outputs_are_those_of_the_model_before():
    torch.manual_seed(0)
    model = Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    convert_to_float8(model, Float8Options(enable=True, emulate=True))
    after = model.state_dict()
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert torch.equal(after[key], value), key
    x = torch.randn(16, 64)
    plain = Net()
    plain.load_state_dict(before)
    # Float8 output of block.w1: the float8 rounding of input and weight (3 mantissa bits) and no more.
    torch.testing.assert_close(model.block.w1(x), plain.block.w1(x), rtol=0.1, atol=0.1)
    assert not torch.equal(model.block.w1(x), plain.block.w1(x))


def test_logs_one_summary_line_with_the_skip_reasons(caplog):
    with caplog.at_level(logging.INFO, logger="titan.float8"):
        convert_to_float8(Net(), ON)
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    # float8.emulate = "auto" on this CPU: emulated, and the line says so (issue 59).
    assert line.startswith(
        "float8 (tensorwise, emulated: this device has no float8 matmul units): converted 3 Linear layers; "
        "skipped odd_in (in_features=24"
    )
    assert "output (matches float8.filter_fqns entry 'output')" in line


def test_disabled_is_a_no_op():
    model = Net()
    report = convert_to_float8(model, Float8Options(enable=False))
    assert report.converted == [] and report.skipped == {}
    assert "Float8Linear" not in kinds(model).values()


def test_converting_again_skips_what_is_already_float8():
    model = Net()
    convert_to_float8(model, ON)
    report = convert_to_float8(model, ON)
    assert report.converted == []
    assert report.skipped["proj"] == "already Float8Linear"


def test_a_bare_linear_is_refused():
    with pytest.raises(ValueError, match="bare nn.Linear"):
        convert_to_float8(nn.Linear(16, 16), ON)


def test_meta_model_with_fsdp_float8_all_gather_wraps_the_weights():
    with torch.device("meta"):
        model = Net()
    convert_to_float8(model, Float8Options(enable=True, enable_fsdp_float8_all_gather=True))
    assert isinstance(model.proj.weight, WeightWithDynamicFloat8CastTensor)
    assert model.proj.weight.device.type == "meta"
    assert not isinstance(model.output.weight, WeightWithDynamicFloat8CastTensor)


@pytest.mark.parametrize("recipe, granularity", [("tensorwise", "TENSORWISE"), ("rowwise", "AXISWISE")])
def test_recipe_and_emulate_reach_torchao(recipe, granularity):
    model = Net()
    convert_to_float8(model, Float8Options(enable=True, recipe=recipe, emulate=True))
    layer = model.proj
    assert isinstance(layer, Float8Linear)
    assert layer.config.cast_config_weight.scaling_granularity.name == granularity
    assert layer.config.emulate and layer.linear_mm_config.output.emulate
