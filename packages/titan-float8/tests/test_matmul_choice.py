"""float8.emulate = "auto": real float8 matmuls where the device has float8 units, emulation elsewhere, decided
once and said in the conversion's line; a forced real float8 on a CPU warns with the slowdown it measured."""

import logging

import pytest
import torch
from torch import nn
from torchao.float8.float8_linear import Float8Linear

from titan_float8 import Float8Options, choose_float8_matmuls, convert_to_float8


@pytest.mark.parametrize(
    ("emulate", "device_type", "capability", "emulated"),
    [
        ("auto", "cuda", (9, 0), False),  # H100 / H200
        ("auto", "cuda", (8, 9), False),  # L40S, RTX 4090
        ("auto", "cuda", None, False),  # a dry run modelling a GPU it cannot query
        ("auto", "cuda", (8, 0), True),  # A100: no FP8 tensor cores
        ("auto", "cpu", None, True),
        (True, "cuda", (9, 0), True),
        (False, "cpu", None, False),
    ],
)
def test_emulate_resolves_by_device(emulate, device_type, capability, emulated):
    choice = choose_float8_matmuls(emulate, device_type, capability)
    assert choice.emulate is emulated
    assert (choice.why is not None) is emulated


def test_auto_is_the_default_and_emulates_on_a_cpu_saying_so(caplog):
    model = nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 32))
    with caplog.at_level(logging.INFO, logger="titan.float8"):
        report = convert_to_float8(model, Float8Options(enable=True), device="cpu")
    assert all(layer.config.emulate for layer in model if isinstance(layer, Float8Linear))
    assert "float8 (tensorwise, emulated: this device has no float8 matmul units)" in caplog.text
    assert report.emulated == "this device has no float8 matmul units"


def test_a_modelled_gpu_gets_real_float8_on_a_cpu():
    """The dry run converts for the CUDA device it models, whatever machine it runs on."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(32, 64))
    report = convert_to_float8(model, Float8Options(enable=True), device="cuda")
    assert report.emulated is None
    assert not model[0].config.emulate


def test_forced_real_float8_on_a_cpu_warns_with_the_measured_slowdown(caplog):
    model = nn.Sequential(nn.Linear(32, 64))
    with caplog.at_level(logging.WARNING, logger="titan.float8"):
        convert_to_float8(model, Float8Options(enable=True, emulate=False), device="cpu")
    assert not model[0].config.emulate
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "x the time of the emulated matmul (measured now" in warning
    assert "--float8.emulate auto" in warning


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_emulate_takes_only_true_false_or_auto(bad):
    with pytest.raises(ValueError, match="float8.emulate=.* must be true, false or 'auto'"):
        Float8Options(enable=True, emulate=bad).validate()
