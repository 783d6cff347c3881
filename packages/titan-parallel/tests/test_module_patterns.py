import torch.nn as nn

from titan_parallel.params.module_patterns import fqn_matches, modules_matching


def _model() -> nn.Module:
    block = lambda: nn.ModuleDict({"attention": nn.Linear(2, 2), "moe": nn.ModuleDict({"experts": nn.Linear(2, 2)})})  # noqa: E731
    return nn.ModuleDict({"layers": nn.ModuleDict({"0": block(), "1": block()}), "output": nn.Linear(2, 2)})


def test_a_pattern_names_the_modules_parallelize_module_would():
    model = _model()
    assert list(modules_matching(model, "layers.*.moe.experts")) == ["layers.0.moe.experts", "layers.1.moe.experts"]
    assert list(modules_matching(model, ["output", "layers.1.attention"])) == ["layers.1.attention", "output"]
    assert list(modules_matching(model, "layers.[0].*")) == ["layers.0.attention", "layers.0.moe"]
    assert list(modules_matching(model, "*")) == ["layers", "output"]  # never the model itself
    assert not fqn_matches("layers.*", "layers.0.attention")  # "*" is one name, never a dot
    assert not fqn_matches("Output", "output")  # case matters, as in FQNs
