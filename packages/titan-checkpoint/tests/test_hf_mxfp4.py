"""MXFP4 tensors in a Hugging Face folder (hf_mxfp4.py): the decoding against the format's definition, and an import
that reads X_blocks + X_scales exactly as it reads X, with a toy adapter shaped like GPT-OSS's experts (down one to
one, gate_up fused) standing in for titan-models' (this package never imports it). Bit-for-bit equality with
transformers' own dequantization, and GPT-OSS's import and export, are in integration/test_gpt_oss_mxfp4.py (this
package's tests run without transformers)."""

import json
import logging

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from titan_checkpoint import CheckpointMismatchError, load_hf_into_model, load_hf_safetensors
from titan_checkpoint.hf_mxfp4 import dequantize_mxfp4

EXPERTS, DIM, HIDDEN, LAYERS = 3, 64, 32, 2


def e2m1(code: int) -> float:
    """The FP4 value of a 4-bit code by the OCP spec: sign, 2 exponent bits (bias 1; 0 is subnormal), 1 mantissa bit."""
    sign = -1.0 if code & 8 else 1.0
    exponent, mantissa = (code >> 1) & 3, code & 1
    return sign * (mantissa * 0.5 if exponent == 0 else (1 + mantissa / 2) * 2.0 ** (exponent - 1))


def by_definition(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[experts, groups * 32, rows] in float64: value 2b (low nibble) and 2b + 1 (high) of group g times 2^(s - 127)."""
    table = torch.tensor([e2m1(code) for code in range(16)], dtype=torch.float64)
    values = torch.stack((table[(blocks % 16).long()], table[(blocks // 16).long()]), dim=-1).flatten(-2)
    values = values * torch.exp2(scales.double() - 127).unsqueeze(-1)
    return values.flatten(-2).transpose(1, 2)


def random_pair(rows: int, cols: int, seed: int, scale_range=(118, 124)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (EXPERTS, rows, cols // 32, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(*scale_range, (EXPERTS, rows, cols // 32), dtype=torch.uint8, generator=g)
    return blocks, scales


@pytest.mark.parametrize("rows_per_chunk", [1, 3, 4096])
def test_every_byte_decodes_low_nibble_first_times_its_groups_power_of_two(rows_per_chunk):
    blocks = torch.arange(256, dtype=torch.uint8).reshape(1, 8, 2, 16).repeat(EXPERTS, 1, 1, 1)
    scales = torch.randint(0, 256, (EXPERTS, 8, 2), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    scales[0, 0] = torch.tensor([0, 255])  # the smallest and the largest powers of two: 2^-127 and 2^128
    out = dequantize_mxfp4(blocks, scales, rows_per_chunk=rows_per_chunk)
    assert out.shape == (EXPERTS, 64, 8) and out.dtype == torch.float32
    assert torch.equal(out, by_definition(blocks, scales).float())


def test_bf16_holds_the_same_values_as_fp32_over_every_scale():
    blocks, scales = random_pair(256, 64, seed=1, scale_range=(0, 256))
    scales[0, :, 0] = torch.arange(256, dtype=torch.uint8)
    fp32 = dequantize_mxfp4(blocks, scales, torch.float32)
    bf16 = dequantize_mxfp4(blocks, scales, torch.bfloat16)
    assert bf16.dtype == torch.bfloat16 and torch.equal(bf16.float(), fp32)


def test_blocks_and_scales_that_do_not_pair_are_refused():
    blocks, scales = random_pair(4, 64, seed=2)
    with pytest.raises(ValueError, match=r"blocks \(3, 4, 2, 16\) and scales \(3, 4, 1\) do not pair"):
        dequantize_mxfp4(blocks, scales[..., :1])


class ExpertsAdapter:
    """Layer i's experts as GPT-OSS's folders hold them: model.layers.i.down [experts, hidden, dim] is our
    layers.i.w2; model.layers.i.gate_up [experts, dim, 2 * hidden] interleaves our w1 (even columns) and w3; a norm."""

    def fused_hf_keys(self) -> dict[str, tuple[str, str]]:
        return {f"model.layers.{i}.gate_up": (f"layers.{i}.w1", f"layers.{i}.w3") for i in range(LAYERS)}

    @staticmethod
    def split_from_hf(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return gate_up[..., ::2].contiguous(), gate_up[..., 1::2].contiguous()

    def hf_keys(self) -> list[str]:
        return ["model.norm", *(f"model.layers.{i}.{name}" for i in range(LAYERS) for name in ("gate_up", "down"))]

    def from_hf_key(self, key: str) -> str:
        if key == "model.norm":
            return "norm"
        if key.endswith(".down"):
            return key.removeprefix("model.").replace(".down", ".w2")
        raise ValueError(f"{key!r} is not a toy parameter name")

    def from_hf_tensor(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor


def mxfp4_tensors() -> dict[str, torch.Tensor]:
    """The folder's tensors with each layer's experts in MXFP4."""
    tensors = {"model.norm": torch.rand(DIM)}
    for i in range(LAYERS):
        for name, rows, cols, seed in (("gate_up", 2 * HIDDEN, DIM, 10 + i), ("down", DIM, HIDDEN, 20 + i)):
            tensors[f"model.layers.{i}.{name}_blocks"], tensors[f"model.layers.{i}.{name}_scales"] = random_pair(
                rows, cols, seed
            )
    return tensors


def write_folder(folder, tensors: dict[str, torch.Tensor]):
    """Two shards and their index: the scales in the second, away from their blocks."""
    folder.mkdir()
    shards = {"a.safetensors": {k: v for k, v in tensors.items() if not k.endswith("_scales")},
              "b.safetensors": {k: v for k, v in tensors.items() if k.endswith("_scales")}}  # fmt: skip
    weight_map = {}
    for name, shard in shards.items():
        if shard:
            save_file(shard, str(folder / name))
            weight_map.update(dict.fromkeys(shard, name))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


def dequantized(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same tensors stored plainly, each MXFP4 pair as the tensor it stands for."""
    plain = {k: v for k, v in tensors.items() if not k.endswith(("_blocks", "_scales"))}
    for key in tensors:
        if key.endswith("_blocks"):
            name = key.removesuffix("_blocks")
            plain[name] = dequantize_mxfp4(tensors[key], tensors[name + "_scales"])
    return plain


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_mxfp4_folder_imports_as_its_dequantized_copy(tmp_path, caplog, dtype):
    tensors = mxfp4_tensors()
    folder = write_folder(tmp_path / "mxfp4", tensors)
    plain = dict(load_hf_safetensors(write_folder(tmp_path / "plain", dequantized(tensors)), ExpertsAdapter()))
    with caplog.at_level(logging.INFO, logger="titan.checkpoint"):
        imported = dict(load_hf_safetensors(folder, ExpertsAdapter(), mxfp4_dtype=dtype))
    assert sorted(imported) == sorted(plain) == sorted(["norm", *(f"layers.{i}.w{n}" for i in range(2) for n in "123")])
    for name, tensor in imported.items():
        assert tensor.dtype == (torch.float32 if name == "norm" else dtype), name
        assert torch.equal(tensor.float(), plain[name]), name
    down = by_definition(tensors["model.layers.1.down_blocks"], tensors["model.layers.1.down_scales"])
    assert torch.equal(imported["layers.1.w2"].double(), down)
    assert f"4 tensor(s) dequantized from MXFP4 to {dtype}" in caplog.text


def test_only_the_pairs_asked_for_are_dequantized(tmp_path, caplog):
    folder = write_folder(tmp_path / "mxfp4", mxfp4_tensors())
    with caplog.at_level(logging.INFO, logger="titan.checkpoint"):
        only = dict(load_hf_safetensors(folder, ExpertsAdapter(), only={"layers.1.w3"}))
    assert list(only) == ["layers.1.w3"] and only["layers.1.w3"].shape == (EXPERTS, DIM, HIDDEN)
    assert "1 tensor(s) dequantized from MXFP4" in caplog.text


@pytest.mark.parametrize("half", ["_blocks", "_scales"])
def test_half_a_pair_is_refused_naming_the_missing_half(tmp_path, half):
    tensors = mxfp4_tensors()
    del tensors[f"model.layers.1.down{half}"]
    folder = write_folder(tmp_path / "mxfp4", tensors)
    present = "_scales" if half == "_blocks" else "_blocks"
    with pytest.raises(CheckpointMismatchError, match=f"holds model.layers.1.down{present} but not "
                                                      f"model.layers.1.down{half}"):  # fmt: skip
        dict(load_hf_safetensors(folder, ExpertsAdapter()))


class Experts(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w3 = (nn.Parameter(torch.empty(EXPERTS, DIM, HIDDEN)) for _ in range(2))
        self.w2 = nn.Parameter(torch.empty(EXPERTS, HIDDEN, DIM))


def test_a_model_loads_the_pairs_dequantized_into_its_own_dtype(tmp_path, caplog):
    tensors = mxfp4_tensors()
    model = nn.Module()
    model.layers = nn.ModuleList(Experts() for _ in range(LAYERS))
    model.norm = nn.Parameter(torch.empty(DIM))
    model.to(torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="titan.checkpoint"):
        load_hf_into_model(model, write_folder(tmp_path / "mxfp4", tensors), ExpertsAdapter())
    assert "4 tensor(s) dequantized from MXFP4 to torch.bfloat16" in caplog.text
    plain = dequantized(tensors)
    assert torch.equal(model.layers[0].w3.float(), plain["model.layers.0.gate_up"][..., 1::2])
    assert torch.equal(model.layers[1].w2.float(), plain["model.layers.1.down"])
