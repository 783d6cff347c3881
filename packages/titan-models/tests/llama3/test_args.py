import dataclasses

import pytest

from titan_models.llama3 import FLAVORS, Llama3Args, RopeScaling, Transformer


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"dim": 250}, "Llama3Args.dim=250 is not divisible by n_heads=16"),
        ({"n_kv_heads": 5}, "Llama3Args.n_heads=16 is not divisible by n_kv_heads=5"),
        ({"n_layers": 0}, "Llama3Args.n_layers=0"),
        ({"dim": 48, "n_heads": 16}, "odd head_dim=3"),
        ({"norm_eps": 0.0}, "Llama3Args.norm_eps=0.0"),
        ({"rope_scaling": RopeScaling(low_freq_factor=4.0, high_freq_factor=1.0)}, "low_freq_factor"),
    ],
)
def test_validate_names_the_field(overrides, message):
    args = dataclasses.replace(FLAVORS["debug"], **overrides)
    with pytest.raises(ValueError, match=message):
        args.validate()
    with pytest.raises(ValueError, match=message):
        Transformer(args)


def test_n_kv_heads_defaults_to_n_heads():
    args = Llama3Args(dim=64, n_heads=4)
    assert args.n_kv_heads is None and args.num_kv_heads == 4
