"""titan-checkpoint with the real Llama 3 and Hugging Face transformers: a trained tiny Llama, exported with
the `titan-checkpoint export` console script, gives our logits in transformers' LlamaForCausalLM (fp32,
atol 1e-4), and our model rebuilt from the exported files alone gives exactly the trained model's logits."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# Single-process saves pass no_dist=True on purpose; DCP warns about it on every call.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")
# The integration session installs transformers; a developer venv without it skips, saying so.
transformers = pytest.importorskip("transformers")
titan_models = pytest.importorskip("titan_models")

from titan_checkpoint import (  # noqa: E402
    CheckpointConfig,
    CheckpointManager,
    ModelState,
    OptimizerState,
    load_hf_into_model,
)

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "packages" / "titan-train" / "src" / "titan_train" / "assets" / "tokenizer.json"


def build_llama(seed: int):
    spec = titan_models.get_model_spec("llama3")
    args = spec.args_for("tiny")
    with torch.device("meta"):
        model = spec.model_cls(args)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(seed=seed)
    return model, args


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny Llama trained 3 steps (so norms and every matrix moved from init), saved at step 3."""
    folder = tmp_path_factory.mktemp("llama")
    model, args = build_llama(seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        tokens = torch.randint(0, args.vocab_size, (2, 17), generator=generator)
        logits = model(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad()
    fingerprint = {"name": "llama3", "flavor": "tiny", "args": dataclasses.asdict(args)}
    states = {"model": ModelState(model), "optimizer": OptimizerState(model, optimizer)}
    with CheckpointManager(folder / "ckpt", states, CheckpointConfig(interval=3), fingerprint=fingerprint) as manager:
        manager.save(3)
    model.eval()
    return model, args, folder


@pytest.fixture(scope="module")
def exported(trained):
    """`titan-checkpoint export` in float32, with small shards, as a user runs it."""
    _, _, folder = trained
    out = folder / "hf"
    command = [str(Path(sys.executable).parent / "titan-checkpoint"), "export", str(folder / "ckpt"), str(out)]
    options = ["--dtype", "float32", "--max-shard-size", "100KB", "--tokenizer", str(TOKENIZER)]
    proc = subprocess.run([*command, *options], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_export_layout(exported):
    shards = sorted(p.name for p in exported.glob("*.safetensors"))
    assert len(shards) > 1 and shards[-1] == f"model-{len(shards):05d}-of-{len(shards):05d}.safetensors"
    assert (exported / "model.safetensors.index.json").is_file() and (exported / "config.json").is_file()
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    assert tokenizer("In the beginning")["input_ids"]


def test_transformers_gives_our_logits(trained, exported):
    model, args, _ = trained
    hf_model = transformers.LlamaForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    tokens = torch.randint(0, args.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(tokens), hf_model(tokens).logits
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)  # reference: LlamaForCausalLM, fp32


def test_our_model_from_the_exported_files_alone_gives_the_same_logits(trained, exported):
    model, args, _ = trained
    rebuilt, _ = build_llama(seed=1)
    load_hf_into_model(rebuilt, exported, titan_models.Llama3HFAdapter(args))
    for name, value in rebuilt.state_dict().items():
        assert torch.equal(value, model.state_dict()[name]), name
    tokens = torch.randint(0, args.vocab_size, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(rebuilt.eval()(tokens), model(tokens))


def test_initial_load_from_hf_finds_the_llama_adapter_by_entry_point(trained, exported, tmp_path):
    model, args, _ = trained
    fresh, _ = build_llama(seed=2)
    fingerprint = {"name": "llama3", "flavor": "tiny", "args": dataclasses.asdict(args)}
    config = CheckpointConfig(initial_load_path=str(exported), initial_load_format="hf")
    manager = CheckpointManager(tmp_path / "new_run", {"model": ModelState(fresh)}, config, fingerprint=fingerprint)
    assert manager.load() == 0
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, model.state_dict()[name]), name
