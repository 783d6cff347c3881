import math

import pytest

from titan_models import get_model_spec
from titan_models.hyena import FLAVORS, count_params, flops_per_token, hyena_plan, hyena_tp_plan
from titan_models.hyena.flops import fft_conv_flops
from titan_models.tp_styles import ChannelShard


def test_plan_names_real_modules(build):
    model = build("tiny")
    plan = hyena_plan(model.args)
    modules = dict(model.named_modules())
    assert plan.block_fqns == ["layers.0", "layers.1"]
    assert all(fqn in modules for fqn in plan.block_fqns + plan.input_fqns + plan.output_fqns)
    for pattern in hyena_tp_plan():
        prefix, _, rest = pattern.partition("*.")
        assert any(name == pattern or (rest and name.startswith(prefix) and name.endswith(rest)) for name in modules)
    assert plan.tp_divisible == {"dim": 64, "ffn_hidden_dim": model.args.hidden_dim}


def test_channel_shards_name_per_channel_tensors(build):
    """Every tensor a ChannelShard entry shards exists and has the module's channels on dim 0."""
    model = build("tiny")
    channel_shards = {k: v for k, v in hyena_tp_plan().items() if isinstance(v, ChannelShard)}
    assert set(channel_shards) == {"layers.*.mixer.short_filter", "layers.*.mixer.filter"}
    mixer = model.layers["0"].mixer
    for pattern, style in channel_shards.items():
        module = mixer.get_submodule(pattern.rpartition(".")[2])
        tensors = dict(module.named_parameters()) | dict(module.named_buffers())
        dims = {tensors[name].shape[0] for name in style.sharded}
        assert dims == {tensors[style.sharded[0]].shape[0]} and dims.pop() % model.args.dim == 0, pattern


def test_flops_per_token_is_6n_plus_the_fft_convolutions():
    args = FLAVORS["125M"]
    conv = 3 * args.n_layers * (args.order - 1) * args.dim * fft_conv_flops(2048)
    assert flops_per_token(args, 2048) == int(6 * count_params(args) + conv)
    # ~15 log2(2L) + 6 per channel and position: 3 FFTs of 2.5 n log2 n (n = 2L) and a complex product.
    assert fft_conv_flops(1024) == pytest.approx(15 * math.log2(2048) + 6 * 1025 / 1024)
    assert flops_per_token(args, 4096) > flops_per_token(args, 2048)  # the conv term grows with log L


def test_registered_without_an_hf_adapter():
    spec = get_model_spec("hyena")
    args = spec.args_for("debug")
    assert spec.plan(args).block_fqns[0] == "layers.0"
    with pytest.raises(NotImplementedError, match="model 'hyena' has no Hugging Face mapping"):
        spec.hf_adapter(args)
