"""The adapter's optional fused_hf_keys() / merge_to_hf() / split_from_hf(): one Hugging Face tensor that holds two
of ours (GPT-OSS's gate_up_proj interleaves our w1 and w3), with a toy adapter that fuses each block's w_in and
w_out standing in for titan-models' (this package never imports it)."""

import ckpt_toy
import pytest
import torch
from test_hf import read_folder

from titan_checkpoint import CheckpointConfig, CheckpointMismatchError, export_safetensors, load_hf_safetensors
from titan_checkpoint import hf_export as hf_export_module
from titan_checkpoint.hf_fused import fused_key_of


class FusingAdapter(ckpt_toy.ToyAdapter):
    """Block i's w_in [2d, d] and w_out [d, 2d] as one Hugging Face tensor model.h.<i>.fused [2d, 2d]: w_in's
    columns interleaved with w_out's transposed."""

    def pairs(self) -> dict[str, tuple[str, str]]:
        return {f"model.h.{i}.fused": (f"layers.{i}.w_in.weight", f"layers.{i}.w_out.weight")
                for i in range(self.args.n_layers)}  # fmt: skip

    def fused_hf_keys(self) -> dict[str, tuple[str, str]]:
        return self.pairs()

    @staticmethod
    def merge_to_hf(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return torch.stack((gate, up.t()), dim=-1).flatten(-2)

    @staticmethod
    def split_from_hf(fused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return fused[..., ::2].contiguous(), fused[..., 1::2].t().contiguous()

    def _refuse(self, name: str) -> None:
        if name in self.pairs() or name in fused_key_of(self.pairs()):
            raise ValueError(f"{name!r} is half of / holds two tensors")

    def to_hf_key(self, fqn: str) -> str:
        self._refuse(fqn)
        return super().to_hf_key(fqn)

    def from_hf_key(self, key: str) -> str:
        self._refuse(key)
        return super().from_hf_key(key)

    def hf_keys(self) -> list[str]:
        unfused = [k for k in super().hf_keys() if not k.endswith((".up.weight", ".down.weight"))]
        return [*unfused, *self.pairs()]


@pytest.fixture
def checkpoint(tmp_path):
    run = ckpt_toy.toy_run(tmp_path / "ckpt", config=CheckpointConfig(interval=1))
    run.step()
    run.manager.save(1)
    return run


@pytest.mark.parametrize("max_shard_size", ["50GB", "3KB"])
def test_a_fused_tensor_is_exported_from_both_halves_and_imported_as_both(checkpoint, tmp_path, max_shard_size):
    adapter = FusingAdapter(ckpt_toy.ToyArgs())
    reads = []
    read = hf_export_module._read_tensor
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hf_export_module, "_read_tensor", lambda r, key, info: reads.append(key) or read(r, key, info))
        out = export_safetensors(tmp_path / "ckpt", tmp_path / "hf", adapter=adapter, dtype="float32",
                                 max_shard_size=max_shard_size)  # fmt: skip
    assert len(reads) == len(set(reads))  # each of ours read once, the fused pair's together
    tensors = read_folder(out)
    assert sorted(tensors) == sorted(adapter.hf_keys())
    expected = ckpt_toy.params(checkpoint.model)
    w_in, w_out = expected["layers.1.w_in.weight"], expected["layers.1.w_out.weight"]
    assert torch.equal(tensors["model.h.1.fused"][:, 0::2], w_in)
    assert torch.equal(tensors["model.h.1.fused"][:, 1::2], w_out.t())

    imported = dict(load_hf_safetensors(out, adapter))
    assert imported.keys() == expected.keys()
    for name, value in imported.items():
        assert torch.equal(value, expected[name]), name
    # Only one half asked for: the other is not yielded.
    only = dict(load_hf_safetensors(out, adapter, only={"layers.0.w_out.weight"}))
    assert list(only) == ["layers.0.w_out.weight"]
    assert torch.equal(only["layers.0.w_out.weight"], expected["layers.0.w_out.weight"])


def test_an_adapter_without_fused_keys_cannot_name_the_fused_tensor(checkpoint, tmp_path):
    out = export_safetensors(tmp_path / "ckpt", tmp_path / "hf", adapter=FusingAdapter(ckpt_toy.ToyArgs()))
    unfused = FusingAdapter(ckpt_toy.ToyArgs())
    unfused.fused_hf_keys = dict
    with pytest.raises(CheckpointMismatchError, match="holds two tensors"):
        dict(load_hf_safetensors(out, unfused))


def test_an_export_missing_one_half_of_a_fused_tensor_is_refused(checkpoint, tmp_path, monkeypatch):
    entries = hf_export_module.model_tensors
    monkeypatch.setattr(hf_export_module, "model_tensors",
                        lambda metadata: [e for e in entries(metadata) if e[0] != "layers.0.w_out.weight"])  # fmt: skip
    with pytest.raises(CheckpointMismatchError, match="holds layers.0.w_in.weight but not layers.0.w_out.weight"):
        export_safetensors(tmp_path / "ckpt", tmp_path / "hf", adapter=FusingAdapter(ckpt_toy.ToyArgs()))
