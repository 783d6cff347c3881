"""model.mtp_layers on `--model.flavor hf:<folder>`: "auto" (the default) takes the MTP layers the folder's
config.json declares and its weights hold; 0 drops them, logged once; another count is refused before any
process group, naming the key, the value and the fix."""

import dataclasses
import json
import logging
import struct

import pytest

from titan_models.deepseek_v3 import FLAVORS, DeepseekV3HFAdapter
from titan_train.config import ConfigError, load_config, parse_argv
from titan_train.config.model_args import model_args


def deepseek_folder(tmp_path, with_mtp_weights: bool = True):
    """config.json of DeepSeek-V3 tiny declaring one MTP layer, and a safetensors file holding only names (the
    flavor reads names, never tensors): the MTP layer's, DeepSeek-style, or none (as transformers saves)."""
    adapter = DeepseekV3HFAdapter(dataclasses.replace(FLAVORS["tiny"], mtp_layers=1))
    (tmp_path / "config.json").write_text(json.dumps(adapter.hf_config()))
    names = [key for key in adapter.hf_keys() if with_mtp_weights or not key.startswith("model.layers.4.")]
    header = json.dumps({n: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
                         for i, n in enumerate(names)}).encode()  # fmt: skip
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(4 * len(names)))
    return tmp_path


def args_of(folder, *overrides: str):
    argv = ["--model.name", "deepseek_v3", "--model.flavor", f"hf:{folder}", "--training.seq_len", "64", *overrides]
    return model_args(load_config(parse_argv(argv)))


def test_auto_takes_the_folders_mtp_layers(tmp_path):
    assert FLAVORS["tiny"].n_layers == 4
    assert args_of(deepseek_folder(tmp_path)).mtp_layers == 1
    assert args_of(deepseek_folder(tmp_path), "--model.mtp_layers", "1").mtp_layers == 1


def test_a_transformers_folder_declaring_mtp_without_its_weights_has_none(tmp_path):
    assert args_of(deepseek_folder(tmp_path, with_mtp_weights=False)).mtp_layers == 0


def test_zero_drops_the_folders_mtp_layers_and_says_so(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="titan"):
        assert args_of(deepseek_folder(tmp_path), "--model.mtp_layers", "0").mtp_layers == 0
    assert "model.mtp_layers = 0 drops the 1 MTP module(s)" in caplog.text
    assert "model.layers.4.* are not loaded, trained or exported" in caplog.text


def test_another_count_is_refused_naming_key_value_and_fix(tmp_path):
    with pytest.raises(ConfigError) as e:
        args_of(deepseek_folder(tmp_path), "--model.mtp_layers", "2")
    assert "model.mtp_layers=2 but model.flavor=" in str(e.value)
    assert 'set model.mtp_layers = "auto" (or 1) to train them, or 0 to drop them' in str(e.value)


def test_a_folders_mtp_layers_are_kept_under_pipeline_parallelism(tmp_path):
    # The last stage holds the MTP module and a copy of the embedding (integration/test_mtp_parity.py: pp cases).
    assert args_of(deepseek_folder(tmp_path), "--parallelism.pipeline_parallel_degree", "2").mtp_layers == 1
