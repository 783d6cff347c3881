"""Published Llama 3.1 sizes, counted on the meta device (no memory allocated)."""

import pytest
import torch

from titan_models.llama3 import FLAVORS, Transformer, count_params, num_params


@pytest.mark.parametrize("flavor, published", [("8B", 8.03e9), ("70B", 7.06e10), ("405B", 4.06e11)])
def test_parameter_count_matches_published(flavor, published):
    with torch.device("meta"):
        model = Transformer(FLAVORS[flavor])
    total = num_params(model, exclude_embedding=False)
    assert abs(total - published) / published < 0.005, total
    assert total == count_params(FLAVORS[flavor], exclude_embedding=False)


def test_published_ffn_hidden_sizes():
    # intermediate_size in Meta's / Hugging Face's Llama 3.1 configs.
    assert [FLAVORS[f].hidden_dim for f in ("8B", "70B", "405B")] == [14336, 28672, 53248]


@pytest.mark.parametrize("flavor", sorted(FLAVORS))
def test_every_flavor_validates(flavor):
    FLAVORS[flavor].validate()
