"""Multi-token prediction through Hugging Face folders: config.json's num_nextn_predict_layers both ways, the MTP
layers a folder's weights hold (transformers declares 1 in every DeepSeek-V3 folder), and DeepSeek's copies of the
shared embedding and head in the MTP layer (written on export, never read on import)."""

import dataclasses
import json
import struct

import pytest
import torch

from titan_models import get_model_spec
from titan_models.deepseek_v3 import FLAVORS as DEEPSEEK_FLAVORS
from titan_models.deepseek_v3 import DeepseekV3HFAdapter
from titan_models.llama3 import FLAVORS as LLAMA_FLAVORS
from titan_models.llama3 import Llama3HFAdapter

ADAPTERS = {"llama3": (Llama3HFAdapter, LLAMA_FLAVORS), "deepseek_v3": (DeepseekV3HFAdapter, DEEPSEEK_FLAVORS)}


def adapter_of(family: str, mtp_layers: int):
    cls, flavors = ADAPTERS[family]
    return cls(dataclasses.replace(flavors["tiny"], mtp_layers=mtp_layers))


@pytest.mark.parametrize("family", list(ADAPTERS))
@pytest.mark.parametrize("mtp_layers", [0, 2])
def test_config_json_carries_the_mtp_layers_both_ways(family, mtp_layers):
    adapter = adapter_of(family, mtp_layers)
    config = adapter.hf_config()
    if family == "deepseek_v3":  # always: transformers' DeepseekV3Config assumes 1 without the key
        assert config["num_nextn_predict_layers"] == mtp_layers
    else:  # Llama's config gains the key only for a model with MTP modules
        assert config.get("num_nextn_predict_layers") == (mtp_layers or None)
    back = type(adapter).from_hf_config(config)
    assert back.args.mtp_layers == mtp_layers and back.hf_config() == config


def test_a_config_without_the_key_has_no_mtp_and_a_bad_count_is_refused():
    config = adapter_of("deepseek_v3", 1).hf_config()
    del config["num_nextn_predict_layers"]
    assert DeepseekV3HFAdapter.from_hf_config(config).args.mtp_layers == 0
    with pytest.raises(ValueError, match="num_nextn_predict_layers=-1"):
        DeepseekV3HFAdapter.from_hf_config({**config, "num_nextn_predict_layers": -1})


@pytest.mark.parametrize("family", list(ADAPTERS))
def test_the_mtp_layers_copies_of_embedding_and_head_are_written_and_never_read(family):
    adapter = adapter_of(family, 2)
    n = adapter.args.n_layers
    assert adapter.hf_copies() == {
        f"model.layers.{n}.embed_tokens.weight": "model.embed_tokens.weight",
        f"model.layers.{n}.shared_head.head.weight": "lm_head.weight",
        f"model.layers.{n + 1}.embed_tokens.weight": "model.embed_tokens.weight",
        f"model.layers.{n + 1}.shared_head.head.weight": "lm_head.weight",
    }
    assert all(adapter.skips_hf_key(key) for key in adapter.hf_copies())
    assert not any(adapter.skips_hf_key(key) for key in adapter.hf_keys())
    # A folder's MTP layers past the model's are skipped; the model's own and its main layers are read.
    assert adapter.skips_hf_key(f"model.layers.{n + 2}.enorm.weight")
    assert not adapter.skips_hf_key(f"model.layers.{n + 1}.enorm.weight")
    assert adapter_of(family, 0).skips_hf_key(f"model.layers.{n}.eh_proj.weight")

    with torch.device("meta"):
        model = get_model_spec(family).model_cls(adapter.args)
    hf = adapter.to_hf(model.state_dict())
    copies = {key: torch.empty(0) for key in adapter.hf_copies()}  # never read: no shape to check
    assert sorted(adapter.from_hf({**hf, **copies})) == sorted(model.state_dict())


def test_a_tied_model_copies_the_embedding_as_the_mtp_head():
    cls, flavors = ADAPTERS["llama3"]
    adapter = cls(dataclasses.replace(flavors["tiny"], mtp_layers=1, tie_word_embeddings=True))
    n = adapter.args.n_layers
    assert adapter.hf_copies()[f"model.layers.{n}.shared_head.head.weight"] == "model.embed_tokens.weight"


# --- Folders: the MTP layers config.json declares and the weights hold --------------------------------------


def write_safetensors_header(file, names):
    """A safetensors file whose tensors are one float32 each (header: 8-byte little-endian length, JSON)."""
    header = {name: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, name in enumerate(names)}
    text = json.dumps(header).encode()
    file.write_bytes(struct.pack("<Q", len(text)) + text + bytes(4 * len(names)))


def folder_of(tmp_path, adapter, declared: int, weights: list[str] | None, index: bool = False):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps({**adapter.hf_config(), "num_nextn_predict_layers": declared}))
    if weights is not None and index:
        weight_map = dict.fromkeys(weights, "model-00001-of-00001.safetensors")
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    elif weights is not None:
        write_safetensors_header(tmp_path / "model.safetensors", weights)
    return tmp_path


@pytest.mark.parametrize("index", [False, True])
def test_a_folders_mtp_layers_are_those_its_weights_hold(tmp_path, index):
    with_mtp = adapter_of("deepseek_v3", 1)
    main = adapter_of("deepseek_v3", 0).hf_keys()
    n = with_mtp.args.n_layers
    # transformers' save_pretrained: num_nextn_predict_layers = 1, no model.layers.<n>.* tensor.
    folder = folder_of(tmp_path / "transformers", with_mtp, 1, main, index)
    assert DeepseekV3HFAdapter.from_hf_folder(folder).args.mtp_layers == 0
    assert DEEPSEEK_FLAVORS[f"hf:{folder}"].mtp_layers == 0
    # DeepSeek's folders: the MTP layer's tensors, copies included.
    folder = folder_of(tmp_path / "deepseek", with_mtp, 1, with_mtp.hf_keys() + list(with_mtp.hf_copies()), index)
    assert DeepseekV3HFAdapter.from_hf_folder(folder).hf_config() == with_mtp.hf_config()
    assert DEEPSEEK_FLAVORS[f"hf:{folder}"].mtp_layers == 1
    # Two declared, one held: the first.
    folder = folder_of(tmp_path / "short", with_mtp, 2, with_mtp.hf_keys(), index)
    assert DEEPSEEK_FLAVORS[f"hf:{folder}"].mtp_layers == 1
    assert not any(key.startswith(f"model.layers.{n + 1}.") for key in with_mtp.hf_keys())


def test_a_folder_without_weights_has_the_mtp_layers_its_config_declares(tmp_path):
    folder = folder_of(tmp_path, adapter_of("deepseek_v3", 1), 1, None)
    assert DEEPSEEK_FLAVORS[f"hf:{folder}"].mtp_layers == 1
