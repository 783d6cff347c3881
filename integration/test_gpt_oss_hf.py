"""A GPT-OSS folder written by transformers itself (save_pretrained of a tiny random GptOssConfig: the shape of
titan-models' tests/gpt_oss/test_hf_parity.py, with the trainer's 2048-token vocabulary), trained on FSDP 2 from its
weights and exported: Hugging Face's fused gate_up_proj(_bias) is read as our w1 and w3 (their biases) and written
back from them (titan-checkpoint's hf_fused.py).

References and tolerances: transformers' GptOssForCausalLM in float32 with eager attention and experts (its sinks);
the trainer's first loss rtol 1e-5 (reductions run in another order); logits atol 1e-4.
"""

import pytest
import torch

# The integration session installs transformers (nox -s integration).
import transformers
from safetensors.torch import load_file

import hf_checks
from hf_checks import first_batch_loss_by_transformers, ours_from, tokens, train_from_folder_and_export
from titan_checkpoint import ModelState, export_safetensors, import_hf_checkpoint, load_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")
SEQ_LEN, BATCH = 64, 2
# Full then windowed attention (window 4, much shorter than the sequence), attention biases, sinks, YaRN, top-2 of 6.
CONFIG = dict(vocab_size=2048, hidden_size=64, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, num_local_experts=6, num_experts_per_tok=2, max_position_embeddings=256,
              num_hidden_layers=2, sliding_window=4, swiglu_limit=3.0, bos_token_id=0, eos_token_id=1,
              rope_parameters={"rope_type": "yarn", "rope_theta": 5000.0, "factor": 8.0,
                               "original_max_position_embeddings": 32, "beta_fast": 32.0, "beta_slow": 1.0,
                               "truncate": False})  # fmt: skip


def eager_hf_model(folder) -> torch.nn.Module:
    """transformers' GPT-OSS as its reference implementation runs it (sinks need eager attention)."""
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """The folder, sinks, biases and norms moved off their initial values (transformers sets the biases to 0)."""
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(transformers.GptOssConfig(**CONFIG))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            elif name.endswith(("sinks", "bias")):
                param.normal_(std=1.0)
            elif "experts" in name:
                param.normal_(std=0.2)
    folder = tmp_path_factory.mktemp("gpt_oss") / "hf"
    model.save_pretrained(folder)
    return folder


def test_training_starts_from_the_folders_weights_and_exports_what_transformers_loads(hf_folder, tmp_path, monkeypatch):
    """3 steps on FSDP 2 from the folder: the first loss is transformers' loss of that batch; the export at the end
    has transformers' keys exactly, and loads in transformers with the trained model's logits."""
    dump = tmp_path / "run"
    rows = train_from_folder_and_export("gpt_oss", hf_folder, dump, SEQ_LEN, BATCH)
    monkeypatch.setattr(hf_checks, "hf_model", eager_hf_model)
    assert rows[0]["loss"] == pytest.approx(first_batch_loss_by_transformers(hf_folder, 2, SEQ_LEN, BATCH), rel=1e-5)

    export = dump / "hf"
    theirs, info = transformers.AutoModelForCausalLM.from_pretrained(
        export, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
        output_loading_info=True,
    )  # fmt: skip
    assert {k: v for k, v in info.items() if v} == {}, info
    _, trained = ours_from(hf_folder)
    load_checkpoint(dump / "checkpoint", {"model": ModelState(trained)})
    _, before = ours_from(hf_folder)
    for name in ("w1", "w3", "w1_bias", "w3_bias"):  # the fused tensor's halves trained, and so exported trained
        assert not torch.equal(getattr(before.layers["0"].feed_forward.experts, name),
                               getattr(trained.layers["0"].feed_forward.experts, name)), name  # fmt: skip
    with torch.no_grad():
        torch.testing.assert_close(theirs.eval()(tokens(2)).logits, trained(tokens(2)), atol=1e-4, rtol=0)


def test_import_then_export_gives_the_folders_tensors_back(hf_folder, tmp_path):
    """`titan-checkpoint import` then `export`: each fused gate_up_proj(_bias) split into two DCP tensors and merged
    back, every tensor equal to the folder's."""
    step = import_hf_checkpoint(hf_folder, tmp_path / "dcp")
    export = export_safetensors(step, tmp_path / "hf", dtype="float32")
    theirs, ours = load_file(hf_folder / "model.safetensors"), load_file(export / "model.safetensors")
    assert sorted(ours) == sorted(theirs) and any(key.endswith("gate_up_proj") for key in ours)
    for key, tensor in theirs.items():
        assert torch.equal(ours[key], tensor), key
