"""The adapter's optional hf_copies() (tensors an export also writes under a second name: DeepSeek-V3's MTP layer
keeps copies of the embedding and head), skips_hf_key() (tensors an import leaves unread) and from_hf_folder()
(a folder's model as its weights confirm its config.json), with the toy adapter standing in for titan-models'."""

import json

import ckpt_toy
import pytest
import torch
from test_hf import read_folder

from titan_checkpoint import (
    CheckpointConfig,
    CheckpointMismatchError,
    adapter_from_hf_folder,
    export_safetensors,
    load_hf_safetensors,
)
from titan_checkpoint import adapters as adapters_module

COPY = "model.extra.embed.weight"


class CopyingAdapter(ckpt_toy.ToyAdapter):
    def hf_copies(self) -> dict[str, str]:
        return {COPY: "model.embed.weight"}

    def skips_hf_key(self, key: str) -> bool:
        return key == COPY


@pytest.fixture
def checkpoint(tmp_path):
    run = ckpt_toy.toy_run(tmp_path / "ckpt", config=CheckpointConfig(interval=1))
    run.step()
    run.manager.save(1)
    return run


@pytest.mark.parametrize("max_shard_size", ["50GB", "3KB"])
def test_a_copy_is_written_beside_its_source_and_never_read_back(checkpoint, tmp_path, max_shard_size):
    adapter = CopyingAdapter(ckpt_toy.ToyArgs())
    out = export_safetensors(tmp_path / "ckpt", tmp_path / "hf", adapter=adapter, dtype="float32",
                             max_shard_size=max_shard_size)  # fmt: skip
    tensors = read_folder(out)
    assert sorted(tensors) == sorted([*adapter.hf_keys(), COPY])
    assert torch.equal(tensors[COPY], tensors["model.embed.weight"])
    index = out / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        assert weight_map[COPY] == weight_map["model.embed.weight"]
        assert json.loads(index.read_text())["metadata"]["total_size"] == sum(t.numel() * 4 for t in tensors.values())
    imported = dict(load_hf_safetensors(out, adapter))
    assert sorted(imported) == sorted(ckpt_toy.params(checkpoint.model))
    # Switched off: an adapter that does not skip the copy cannot name it.
    with pytest.raises(CheckpointMismatchError, match="not a toy parameter name"):
        dict(load_hf_safetensors(out, ckpt_toy.ToyAdapter(ckpt_toy.ToyArgs())))


def test_a_folder_is_read_through_from_hf_folder_where_the_adapter_has_it(tmp_path, monkeypatch):
    class FolderAdapter(ckpt_toy.ToyAdapter):
        @classmethod
        def from_hf_folder(cls, folder):
            return cls(ckpt_toy.ToyArgs(n_layers=1))

    monkeypatch.setattr(adapters_module, "_entry_points", lambda: {"toy": lambda: FolderAdapter})
    (tmp_path / "config.json").write_text(json.dumps(ckpt_toy.ToyAdapter(ckpt_toy.ToyArgs()).hf_config()))
    name, adapter = adapter_from_hf_folder(tmp_path)
    assert (name, adapter.args.n_layers) == ("toy", 1)
