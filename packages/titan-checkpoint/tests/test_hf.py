"""Export to Hugging Face layout and import back, with the toy adapter standing in for titan-models'.
What transformers makes of these files is checked in integration/test_checkpoint_hf.py."""

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
from titan_checkpoint import progress as progress_module
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
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"

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
    # config.json says which model the folder holds: refused before any tensor is read, naming the key.
    with pytest.raises(CheckpointMismatchError, match=r"holds another model .*num_hidden_layers: ours 3, theirs 2"):
        load_hf_into_model(ckpt_toy.ToyLM(deeper), tmp_path / "hf", ckpt_toy.ToyAdapter(deeper))
    (tmp_path / "hf" / "config.json").unlink()  # without it, the tensors themselves are checked
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
    tokenizer = write_tokenizer(tmp_path / "tok", post_processor={"type": "TemplateProcessing"})
    out = tmp_path / "hf"
    args = ["export", str(tmp_path / "ckpt"), str(out), "--dtype", "float32", "--tokenizer", str(tokenizer)]
    assert main(args) == 0
    assert (out / "tokenizer.json").read_bytes() == tokenizer.read_bytes()  # it has a post-processor: as is
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == [1, 2, 3]
    assert main([*args]) == 1  # the destination is not empty
    assert "exists and is not empty" in capsys.readouterr().err

    assert main(["list", str(tmp_path / "ckpt")]) == 0
    assert "step-2\t" in capsys.readouterr().out
    assert main(["verify", str(tmp_path / "ckpt")]) == 0
    assert "ok (sizes and CRC-32s)" in capsys.readouterr().out

    assert main(["export", str(tmp_path / "ckpt"), str(tmp_path / "x"), "--model", "gpt9"]) == 2  # a usage mistake
    assert "no Hugging Face adapter named 'gpt9' in entry-point group 'titan.hf_adapters'; available: toy" in (
        capsys.readouterr().err
    )


LLAMA_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")


def write_tokenizer(folder, post_processor=None, specials=LLAMA_SPECIALS, config_text=None):
    """A tokenizer.json as `tokenizers` writes one (the fields export reads), and optionally a
    tokenizer_config.json with exactly `config_text`; returns the tokenizer.json path."""
    folder.mkdir(parents=True, exist_ok=True)
    added = [
        {"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": True}
        for i, name in enumerate(specials)
    ]  # fmt: skip
    vocab = {name: i for i, name in enumerate(specials)} | {"a": len(specials), "b": len(specials) + 1}
    tokenizer = {"version": "1.0", "added_tokens": added, "post_processor": post_processor,
                 "model": {"type": "BPE", "vocab": vocab, "merges": []}}  # fmt: skip
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, indent=1))
    if config_text is not None:
        (folder / "tokenizer_config.json").write_text(config_text)
    return folder / "tokenizer.json"


def test_one_model_safetensors_file_by_default(trained, tmp_path, toy_adapter_registered):
    out = export_safetensors(tmp_path / "ckpt", tmp_path / "hf", dtype="float32")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]  # no index for one file
    imported = dict(load_hf_safetensors(out, ckpt_toy.ToyAdapter(ckpt_toy.ToyArgs())))
    assert all(torch.equal(v, ckpt_toy.params(trained.model)[k]) for k, v in imported.items())


def test_export_logs_progress_while_it_writes(trained, tmp_path, toy_adapter_registered, monkeypatch, caplog):
    monkeypatch.setattr(progress_module, "PROGRESS_SECONDS", 0.0)
    with caplog.at_level("INFO", logger="titan.checkpoint"):
        export_safetensors(tmp_path / "ckpt", tmp_path / "hf", dtype="float32")
    progress = [r.message for r in caplog.records if "exporting to" in r.message]
    assert len(progress) == len(ckpt_toy.ToyAdapter(ckpt_toy.ToyArgs()).hf_keys()) and "(100%" in progress[-1]


def test_import_logs_progress_while_it_reads(trained, tmp_path, toy_adapter_registered, monkeypatch, caplog):
    from titan_checkpoint import import_hf_checkpoint

    export_safetensors(tmp_path / "ckpt", tmp_path / "hf", dtype="float32")
    monkeypatch.setattr(progress_module, "PROGRESS_SECONDS", 0.0)
    with caplog.at_level("INFO", logger="titan.checkpoint"):
        import_hf_checkpoint(tmp_path / "hf", tmp_path / "imported")
    progress = [r.message for r in caplog.records if "importing" in r.message]
    assert len(progress) == len(ckpt_toy.ToyAdapter(ckpt_toy.ToyArgs()).hf_keys()) and "(100%" in progress[-1]


def test_users_tokenizer_config_is_kept_byte_for_byte(trained, tmp_path, toy_adapter_registered):
    """The trainer passes the tokenizer.json file; its folder's tokenizer_config.json comes with it, as
    written (odd spacing included), and its bos/eos names pick the ids in config.json."""
    config_text = '{"bos_token": "<|end_of_text|>",   "eos_token": {"content": "<|begin_of_text|>"},\n "x": 1}'
    tokenizer = write_tokenizer(tmp_path / "tok", config_text=config_text)
    out = export_safetensors(tmp_path / "ckpt", tmp_path / "hf", tokenizer=tokenizer)
    assert (out / "tokenizer_config.json").read_text() == config_text
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, [0, 2, 3])  # end of message / turn stop too
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "eos_token_id": [0, 2, 3], "do_sample": True, "temperature": 0.6,
                          "top_p": 0.9}  # fmt: skip


def test_tokenizer_without_post_processor_gets_bos_in_the_exported_copy_only(trained, tmp_path, toy_adapter_registered):
    tokenizer = write_tokenizer(tmp_path / "tok", specials=("<|begin_of_text|>", "<|end_of_text|>"))
    original = tokenizer.read_bytes()
    out = export_safetensors(tmp_path / "ckpt", tmp_path / "hf", tokenizer=tokenizer)
    assert tokenizer.read_bytes() == original  # training's file is untouched
    exported = json.loads((out / "tokenizer.json").read_text())
    bos = {"id": "<|begin_of_text|>", "ids": [0], "tokens": ["<|begin_of_text|>"]}
    assert exported["post_processor"] == {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos["id"], "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": bos["id"], "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": bos["id"], "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos["id"]: bos},
    }  # fmt: skip
    assert {k: v for k, v in exported.items() if k != "post_processor"} == {
        k: v for k, v in json.loads(original).items() if k != "post_processor"
    }
    config = json.loads((out / "tokenizer_config.json").read_text())  # none given: a complete one
    assert {k: config[k] for k in ("bos_token", "eos_token", "tokenizer_class", "clean_up_tokenization_spaces")} == {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|end_of_text|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
    }
    assert config["added_tokens_decoder"]["1"]["content"] == "<|end_of_text|>"
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == 1


def test_cli_import_writes_a_dcp_checkpoint_that_needs_nothing_else(trained, tmp_path, toy_adapter_registered):
    from titan_checkpoint import load_checkpoint, read_meta

    write_tokenizer(tmp_path / "hf_src")
    export_safetensors(tmp_path / "ckpt", tmp_path / "hf", tokenizer=tmp_path / "hf_src", dtype="float32")
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 0
    step0 = tmp_path / "imported" / "step-0"
    meta = read_meta(step0)
    assert meta["model"]["name"] == "toy" and meta["model"]["args"] == {"vocab_size": 32, "dim": 16, "n_layers": 2}
    assert (
        meta["model"]["tokenizer"] == "tokenizer" and (tmp_path / "imported" / "tokenizer" / "tokenizer.json").is_file()
    )
    fresh = ckpt_toy.ToyLM(ckpt_toy.ToyArgs())
    assert load_checkpoint(tmp_path / "imported", {"model": ckpt_toy.ModelState(fresh)}) == 0
    for name, value in ckpt_toy.params(fresh).items():
        assert torch.equal(value, ckpt_toy.params(trained.model)[name]), name
    # Exported again from its own metadata alone (no fingerprint, no adapter, no tokenizer named).
    again = export_safetensors(tmp_path / "imported", tmp_path / "hf2", dtype="float32")
    assert read_folder(again).keys() == read_folder(tmp_path / "hf").keys()
    assert (again / "tokenizer.json").is_file() and json.loads((again / "config.json").read_text())["bos_token_id"] == 0
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 1  # holds a checkpoint already


def test_initial_load_path_takes_an_hf_folder_whatever_the_format_says(trained, tmp_path, toy_adapter_registered):
    export_safetensors(tmp_path / "ckpt", tmp_path / "hf", dtype="float32")
    config = CheckpointConfig(initial_load_path=str(tmp_path / "hf"))  # initial_load_format stays "dcp"
    new_run = ckpt_toy.toy_run(tmp_path / "new", seed=9, config=config)
    assert new_run.manager.load() == 0
    for name, value in ckpt_toy.params(new_run.model).items():
        assert torch.equal(value, ckpt_toy.params(trained.model)[name]), name


def test_a_run_refuses_an_imported_checkpoint_of_another_model(trained, tmp_path, toy_adapter_registered):
    export_safetensors(tmp_path / "ckpt", tmp_path / "hf", dtype="float32")
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 0
    wider = ckpt_toy.ToyArgs(dim=32)
    config = CheckpointConfig(initial_load_path=str(tmp_path / "imported"))
    run = ckpt_toy.toy_run(tmp_path / "new", config=config, model_fingerprint=ckpt_toy.fingerprint(wider))
    with pytest.raises(
        CheckpointMismatchError, match="holds another model than this run's: hidden_size: ours 32, theirs 16"
    ):
        run.manager.load()
    # The same when a run resumes in the folder the import wrote.
    resumed = ckpt_toy.toy_run(tmp_path / "imported", model_fingerprint=ckpt_toy.fingerprint(wider))
    with pytest.raises(CheckpointMismatchError, match="hidden_size: ours 32, theirs 16"):
        resumed.manager.load()
    same = ckpt_toy.toy_run(tmp_path / "imported", seed=9)  # the imported model itself: its weights load
    assert same.manager.load() == 0
    assert all(torch.equal(v, ckpt_toy.params(trained.model)[k]) for k, v in ckpt_toy.params(same.model).items())
