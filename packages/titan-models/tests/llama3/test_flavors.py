"""Published Llama 3.1 and 3.2 sizes, counted on the meta device (no memory allocated)."""

import json

import pytest
import torch

from titan_models.llama3 import FLAVORS, Transformer, count_params, num_params


@pytest.mark.parametrize(
    "flavor, published", [("1B", 1.24e9), ("3B", 3.21e9), ("8B", 8.03e9), ("70B", 7.06e10), ("405B", 4.06e11)]
)
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


def test_hf_folder_flavor_reads_its_config_json(tmp_path):
    """`hf:<folder>`: the shape of a Hugging Face folder (here Llama 3.2 1B's published config.json keys)."""
    from titan_models import get_model_spec
    from titan_models.llama3 import hf_config

    (tmp_path / "config.json").write_text(json.dumps(hf_config(FLAVORS["1B"]) | {"rope_parameters": None}))
    spec = get_model_spec("llama3")
    args = spec.args_for(f"hf:{tmp_path}")
    assert hf_config(args) == hf_config(FLAVORS["1B"]) and args.tie_word_embeddings
    assert f"hf:{tmp_path / 'elsewhere'}" not in FLAVORS and f"hf:{tmp_path}" not in list(FLAVORS)
    (tmp_path / "config.json").write_text(json.dumps(hf_config(FLAVORS["1B"]) | {"hidden_act": "gelu"}))
    with pytest.raises(ValueError, match="config.json does not describe a Llama 3 model .*hidden_act='gelu'"):
        spec.args_for(f"hf:{tmp_path}")
