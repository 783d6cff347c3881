import dataclasses

import pytest

from titan_models.hyena import FLAVORS, HyenaArgs, count_params


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(dim=0), r"HyenaArgs.dim=0 must be a positive integer"),
        (dict(order=1), r"HyenaArgs.order=1 must be an integer >= 2"),
        (dict(filter_emb_dim=8), r"HyenaArgs.filter_emb_dim=8 must be odd and >= 3"),
        (dict(decay_fast=2.0), r"need 0 < decay_fast <= decay_slow, got decay_fast=2.0, decay_slow=1.5"),
        (dict(norm_eps=0.0), r"HyenaArgs.norm_eps=0.0 must be > 0"),
    ],
)
def test_validate_names_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(HyenaArgs(), **overrides).validate()


def test_flavors_validate_and_125m_is_125m():
    for args in FLAVORS.values():
        args.validate()
    assert FLAVORS["tiny"].dim == 64 and FLAVORS["tiny"].n_layers == 2 and FLAVORS["tiny"].vocab_size == 2048
    assert FLAVORS["debug"].dim == 256 and FLAVORS["debug"].vocab_size == 2048
    # Non-embedding parameters (the untied LM head included), as the Hyena paper counts its 125M model.
    assert 120e6 < count_params(FLAVORS["125M"]) < 130e6
