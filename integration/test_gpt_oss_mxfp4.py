"""GPT-OSS folders with the experts in MXFP4, as openai/gpt-oss-20b and -120b are published, imported through
titan-checkpoint (hf_mxfp4.py; its own tests check the decoding against the format's definition, without
transformers). References: transformers' integrations.mxfp4.convert_moe_packed_tensors, bit for bit on the same blocks
and scales, and transformers' GptOssForCausalLM (float32, eager attention and experts) loaded with its dequantized
weights: logits atol 1e-4 (titan-models' tests/gpt_oss/test_hf_parity.py's tolerance).

The folder is quantized exactly: random FP4 codes and scales come first, transformers dequantizes them, a model built
with those weights is saved, and its experts are then replaced by the blocks and scales (in another shard than each
other, under the index) with config.json's quantization_config."""

import json
import logging

import pytest
import torch

# The integration session installs transformers (nox -s integration).
import transformers
from safetensors.torch import load_file, save_file
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from titan_checkpoint import CheckpointMismatchError, export_safetensors, import_hf_checkpoint, load_hf_into_model
from titan_checkpoint.hf_mxfp4 import dequantize_mxfp4
from titan_models.decoder import Decoder
from titan_models.gpt_oss import GptOssHFAdapter

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")

SEQ_LEN, BATCH = 24, 2
# MXFP4 groups 32 values along the input dimension: hidden_size and intermediate_size are multiples of 32.
CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, num_local_experts=6, num_experts_per_tok=2, max_position_embeddings=256,
              num_hidden_layers=2, sliding_window=4, swiglu_limit=3.0,
              rope_parameters={"rope_type": "yarn", "rope_theta": 5000.0, "factor": 8.0,
                               "original_max_position_embeddings": 32, "beta_fast": 32.0, "beta_slow": 1.0,
                               "truncate": False})  # fmt: skip
# As the published config.json has it.
QUANTIZATION = {"quant_method": "mxfp4",
                "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                           "model.embed_tokens", "lm_head"]}  # fmt: skip
EXPERTS = ("gate_up_proj", "down_proj")


def random_mxfp4(experts: int, rows: int, cols: int, generator: torch.Generator, scales=(119, 125)):
    """Blocks [experts, rows, cols / 32, 16] of random FP4 codes (every nibble value) and their scales."""
    blocks = torch.randint(0, 256, (experts, rows, cols // 32, 16), dtype=torch.uint8, generator=generator)
    return blocks, torch.randint(*scales, (experts, rows, cols // 32), dtype=torch.uint8, generator=generator)


def test_our_dequantization_is_transformers_bit_for_bit():
    generator = torch.Generator().manual_seed(0)
    blocks, scales = random_mxfp4(5, 48, 96, generator, scales=(0, 256))  # every scale, 255 (2^128) too
    # Every low nibble beside every other high one: a swapped nibble order shows.
    blocks[0, 0, 0] = torch.arange(16, dtype=torch.uint8) * 16 + torch.arange(15, -1, -1, dtype=torch.uint8)
    scales[0, :, 0] = torch.arange(0, 240, 5, dtype=torch.uint8)
    for dtype, bits in ((torch.float32, torch.int32), (torch.bfloat16, torch.int16)):
        theirs = convert_moe_packed_tensors(blocks, scales, dtype=dtype)
        ours = dequantize_mxfp4(blocks, scales, dtype, rows_per_chunk=7)
        assert ours.shape == theirs.shape == (5, 96, 48)
        assert torch.equal(ours.view(bits), theirs.view(bits)), dtype


def tokens() -> torch.Tensor:
    return torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ_LEN), generator=torch.Generator().manual_seed(7))


def hf_model(folder) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(plain: transformers' save of the dequantized weights, mxfp4: the same with the experts' blocks and scales,
    {HF key: transformers' dequantization})."""
    torch.manual_seed(0)
    config = transformers.GptOssConfig(**CONFIG)
    model = transformers.GptOssForCausalLM(config)
    generator = torch.Generator().manual_seed(1)
    packed, weights = {}, {}
    experts, dim, hidden = config.num_local_experts, config.hidden_size, config.intermediate_size
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            elif name.endswith(("sinks", "bias")):
                param.normal_(std=1.0)
            elif name.endswith(EXPERTS):
                rows, cols = (2 * hidden, dim) if name.endswith("gate_up_proj") else (dim, hidden)
                packed[name] = random_mxfp4(experts, rows, cols, generator)
                weights[name] = convert_moe_packed_tensors(*packed[name], dtype=torch.float32)
                param.copy_(weights[name])
    root = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    model.save_pretrained(root / "plain")
    tensors = load_file(root / "plain" / "model.safetensors")
    assert set(packed) <= set(tensors)
    mxfp4 = root / "mxfp4"
    mxfp4.mkdir()
    shards = {"model-00001-of-00002.safetensors": {k: v for k, v in tensors.items() if k not in packed},
              "model-00002-of-00002.safetensors": {}}  # fmt: skip
    for name, (blocks, scales) in packed.items():
        shards["model-00001-of-00002.safetensors"][f"{name}_blocks"] = blocks
        shards["model-00002-of-00002.safetensors"][f"{name}_scales"] = scales
    weight_map = {}
    for file, shard in shards.items():
        save_file(shard, str(mxfp4 / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    (mxfp4 / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config_json = json.loads((root / "plain" / "config.json").read_text())
    (mxfp4 / "config.json").write_text(json.dumps({**config_json, "quantization_config": QUANTIZATION}))
    return root / "plain", mxfp4, weights


def load_ours(folder) -> Decoder:
    adapter = GptOssHFAdapter.from_hf_folder(folder)
    model = Decoder(adapter.args)
    model.init_weights(seed=1)
    load_hf_into_model(model, folder, adapter)
    return model.eval()


def test_mxfp4_experts_import_as_transformers_dequantizes_them(folders, caplog):
    plain, mxfp4, weights = folders
    with caplog.at_level(logging.INFO, logger="titan.checkpoint"):
        ours = load_ours(mxfp4)
    assert "4 tensor(s) dequantized from MXFP4 to torch.float32; an export writes them unquantized" in caplog.text
    for i, layer in ours.layers.items():
        experts = layer.feed_forward.experts
        gate_up, down = (weights[f"model.layers.{i}.mlp.experts.{name}"] for name in EXPERTS)
        assert torch.equal(experts.w1.detach(), gate_up[..., ::2]), i
        assert torch.equal(experts.w3.detach(), gate_up[..., 1::2]), i
        assert torch.equal(experts.w2.detach(), down), i
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens()), hf_model(plain)(tokens()).logits, atol=1e-4, rtol=0)


def test_blocks_without_their_scales_are_refused_naming_the_scales(folders, tmp_path):
    _, mxfp4, _ = folders
    broken = tmp_path / "broken"
    broken.mkdir()
    for file in mxfp4.iterdir():
        (broken / file.name).write_bytes(file.read_bytes())
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.layers.1.mlp.experts.down_proj_scales"]
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    key = r"model\.layers\.1\.mlp\.experts\.down_proj"
    with pytest.raises(CheckpointMismatchError, match=f"holds {key}_blocks but not {key}_scales"):
        load_ours(broken)


def test_the_export_of_an_mxfp4_import_is_unquantized(folders, tmp_path, caplog):
    plain, mxfp4, weights = folders
    with caplog.at_level(logging.INFO, logger="titan.checkpoint"):
        step = import_hf_checkpoint(mxfp4, tmp_path / "dcp")
        out = export_safetensors(step, tmp_path / "hf", dtype="float32")
    assert "none quantized" in caplog.text
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    exported = load_file(out / "model.safetensors")
    assert not [key for key in exported if key.endswith(("_blocks", "_scales"))]
    assert sorted(exported) == sorted(load_file(plain / "model.safetensors"))
    for key, weight in weights.items():
        assert exported[key].dtype == torch.float32 and torch.equal(exported[key], weight), key
