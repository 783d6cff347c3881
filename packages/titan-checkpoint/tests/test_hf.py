"""Export to Hugging Face layout and import back, with the toy adapter standing in for titan-models'."""

import json
import os

import ckpt_toy
import pytest
import torch
from safetensors import safe_open

from titan_checkpoint import (
    CheckpointConfig,
    CheckpointCorruptError,
    CheckpointMismatchError,
    export_safetensors,
    load_hf_into_model,
    load_hf_safetensors,
)
from titan_checkpoint import hf_export as hf_export_module
from titan_checkpoint.cli import main


@pytest.fixture
def trained(tmp_path):
    """A toy run trained 2 steps and saved as step 2; returns the run."""
    run = ckpt_toy.toy_run(tmp_path / "ckpt", config=CheckpointConfig(interval=2))
    for step in (1, 2):
        run.step()
        run.manager.save(step)
    return run


def read_folder(folder):
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            tensors.update({key: f.get_tensor(key) for key in f.keys()})
    return tensors


def test_export_then_import_gives_identical_tensors(trained, tmp_path, toy_adapter_registered):
    out = export_safetensors(tmp_path / "ckpt", tmp_path / "hf", dtype="float32", max_shard_size="3KB")
    names = sorted(p.name for p in out.iterdir())
    shards = [n for n in names if n.endswith(".safetensors")]
    assert (
        len(shards) > 1
        and shards == [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, 7)][: len(shards)]
    )
    assert {"model.safetensors.index.json", "config.json"} <= set(names)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(ckpt_toy.ToyAdapter(ckpt_toy.ToyArgs()).hf_keys())
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in read_folder(out).values())
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float32"

    adapter = ckpt_toy.ToyAdapter(ckpt_toy.ToyArgs())
    imported = dict(load_hf_safetensors(out, adapter))
    expected = ckpt_toy.params(trained.model)
    assert imported.keys() == expected.keys()
    for name, value in imported.items():
        assert torch.equal(value, expected[name]), name
    # Their layout, not ours: w_in's rows are reordered by the adapter.
    assert torch.equal(read_folder(out)["model.h.0.up.weight"], expected["layers.0.w_in.weight"].flip(0))


def test_export_streams_one_tensor_at_a_time_and_one_shard_at_a_time(trained, tmp_path, monkeypatch):
    reads, shard_bytes = [], []
    read, save = hf_export_module._read_tensor, hf_export_module.save_file
    monkeypatch.setattr(hf_export_module, "_read_tensor", lambda r, key, info: reads.append(key) or read(r, key, info))
    monkeypatch.setattr(
        hf_export_module,
        "save_file",
        lambda tensors, *a, **k: shard_bytes.append(sum(t.nbytes for t in tensors.values())) or save(tensors, *a, **k),
    )
    adapter = ckpt_toy.ToyAdapter(ckpt_toy.ToyArgs())
    export_safetensors(tmp_path / "ckpt", tmp_path / "hf", adapter=adapter, dtype="bfloat16", max_shard_size=2048)
    assert len(reads) == len(set(reads)) == len(adapter.hf_keys())  # each tensor read once, on its own
    assert len(shard_bytes) > 1 and max(shard_bytes) <= 2048
    assert {t.dtype for t in read_folder(tmp_path / "hf").values()} == {torch.bfloat16}


def test_import_as_initial_weights_of_a_new_run(trained, tmp_path, toy_adapter_registered):
    export_safetensors(tmp_path / "ckpt", tmp_path / "hf", dtype="float32")
    config = CheckpointConfig(initial_load_path=str(tmp_path / "hf"), initial_load_format="hf")
    new_run = ckpt_toy.toy_run(tmp_path / "new", seed=9, config=config)
    assert new_run.manager.load() == 0
    for name, value in ckpt_toy.params(new_run.model).items():
        assert torch.equal(value, ckpt_toy.params(trained.model)[name]), name


def test_import_refuses_another_model_shape(trained, tmp_path):
    export_safetensors(tmp_path / "ckpt", tmp_path / "hf", adapter=ckpt_toy.ToyAdapter(ckpt_toy.ToyArgs()))
    deeper = ckpt_toy.ToyArgs(n_layers=3)
    with pytest.raises(CheckpointMismatchError, match=r"lacks 3 tensor\(s\) the model needs, e.g. model.h.2.ln.weight"):
        load_hf_into_model(ckpt_toy.ToyLM(deeper), tmp_path / "hf", ckpt_toy.ToyAdapter(deeper))
    wider = ckpt_toy.ToyArgs(vocab_size=64)
    with pytest.raises(
        CheckpointMismatchError, match=r"(out|tok).weight has shape \(32, 16\) in the Hugging Face files but \(64, 16\)"
    ):
        load_hf_into_model(ckpt_toy.ToyLM(wider), tmp_path / "hf", ckpt_toy.ToyAdapter(wider))


def test_truncated_safetensors_file_is_named(trained, tmp_path):
    adapter = ckpt_toy.ToyAdapter(ckpt_toy.ToyArgs())
    export_safetensors(tmp_path / "ckpt", tmp_path / "hf", adapter=adapter, max_shard_size=2048)
    file = sorted((tmp_path / "hf").glob("*.safetensors"))[1]
    os.truncate(file, file.stat().st_size - 100)
    with pytest.raises(CheckpointCorruptError, match=rf"{file} cannot be opened as safetensors"):
        load_hf_into_model(ckpt_toy.ToyLM(ckpt_toy.ToyArgs()), tmp_path / "hf", adapter)


def test_cli_export_list_verify(trained, tmp_path, toy_adapter_registered, capsys):
    tokenizer = tmp_path / "tok.json"
    tokenizer.write_text('{"version": "1.0"}')
    out = tmp_path / "hf"
    args = ["export", str(tmp_path / "ckpt"), str(out), "--dtype", "float32", "--tokenizer", str(tokenizer)]
    assert main(args) == 0
    assert (out / "tokenizer.json").read_text() == '{"version": "1.0"}'
    assert json.loads((out / "tokenizer_config.json").read_text()) == {"tokenizer_class": "PreTrainedTokenizerFast"}
    assert main([*args]) == 1  # the destination is not empty
    assert "exists and is not empty" in capsys.readouterr().err

    assert main(["list", str(tmp_path / "ckpt")]) == 0
    assert "step-2\t" in capsys.readouterr().out
    assert main(["verify", str(tmp_path / "ckpt")]) == 0
    assert "ok (sizes and CRC-32s)" in capsys.readouterr().out

    assert main(["export", str(tmp_path / "ckpt"), str(tmp_path / "x"), "--model", "gpt9"]) == 1
    assert "no Hugging Face adapter named 'gpt9' in entry-point group 'titan.hf_adapters'; available: toy" in (
        capsys.readouterr().err
    )
