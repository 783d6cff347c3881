"""The Hugging Face export as a new user meets it: a trained tiny Llama exported with the `titan-checkpoint
export` console script, then loaded from the folder alone by transformers' AutoModelForCausalLM and
AutoTokenizer, and by titan-generate.

References and tolerances: transformers' LlamaForCausalLM; float32 logits atol 1e-4; a bfloat16 export
(weights rounded to 8 mantissa bits) atol 0.05 on logits of magnitude ~3; greedy tokens exactly equal.
"""

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers  # the integration session installs it

import titan_models
from launch_helpers import DEBUG_RECIPE, _env, run_titan
from titan_checkpoint import (
    CheckpointConfig,
    CheckpointManager,
    ModelState,
    OptimizerState,
    adapter_from_meta,
    load_hf_into_model,
)
from titan_models.generate import generate
from titan_train.data.tokenizer import load_tokenizer

# Single-process saves pass no_dist=True on purpose; DCP warns about it on every call.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TOKENIZER = ROOT / "packages" / "titan-train" / "src" / "titan_train" / "assets" / "tokenizer.json"
PROMPT = "And God said"
TEXTS = ["In the beginning God created the heaven and the earth.", "Jesus wept.", " leading space", ""]


def build_llama(seed: int, flavor: str = "tiny"):
    spec = titan_models.get_model_spec("llama3")
    args = spec.args_for(flavor)
    with torch.device("meta"):
        model = spec.model_cls(args)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(seed=seed)
    return model, args


def make_eos_the_greedy_choice_soon(model) -> None:
    """Swap the output rows of EOS and of a greedy token a few steps into PROMPT's continuation, so greedy
    decoding reaches EOS there: a random tiny model would never emit it, and stopping is what is tested."""
    tokenizer = load_tokenizer(None)
    greedy = generate(model, tokenizer.encode(PROMPT, eos=False), 6).tolist()
    assert tokenizer.eos_id not in greedy
    k = next(k for k in range(2, 6) if greedy[k] not in greedy[:k])
    with torch.no_grad():
        rows = model.output.weight[[greedy[k], tokenizer.eos_id]].clone()
        model.output.weight[[tokenizer.eos_id, greedy[k]]] = rows


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny Llama trained 3 steps (so norms and every matrix moved from init), saved at step 3 with the
    metadata titan-train writes (fingerprint and model description)."""
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
    model.eval()
    make_eos_the_greedy_choice_soon(model)
    fields = dataclasses.asdict(args)
    fingerprint = {"name": "llama3", "flavor": "tiny", "args": {k: v for k, v in fields.items() if k != "max_seq_len"}}
    model_meta = {"name": "llama3", "flavor": "tiny", "args": fields, "tokenizer": ""}
    states = {"model": ModelState(model), "optimizer": OptimizerState(model, optimizer)}
    config = CheckpointConfig(interval=3)
    with CheckpointManager(folder / "ckpt", states, config, fingerprint=fingerprint, model_meta=model_meta) as m:
        m.save(3)
    return model, args, folder


def export(checkpoint: Path, out: Path, *options: str) -> Path:
    """`titan-checkpoint export` as a user runs it."""
    command = [str(BIN / "titan-checkpoint"), "export", str(checkpoint), str(out), "--tokenizer", str(TOKENIZER)]
    proc = subprocess.run([*command, *options], capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def exported(trained):
    return export(trained[2] / "ckpt", trained[2] / "hf", "--dtype", "float32")


def test_export_writes_what_serving_stacks_read(trained, exported):
    _, args, _ = trained
    names = sorted(p.name for p in exported.iterdir())
    assert names == ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json"]  # fmt: skip
    tokenizer = load_tokenizer(None)
    config = transformers.AutoConfig.from_pretrained(exported)
    assert (config.bos_token_id, config.eos_token_id) == (tokenizer.bos_id, tokenizer.eos_id)
    assert config.max_position_embeddings == args.max_seq_len and config.dtype == torch.float32
    generation = transformers.GenerationConfig.from_pretrained(exported)
    assert (generation.bos_token_id, generation.eos_token_id) == (tokenizer.bos_id, tokenizer.eos_id)


def test_auto_tokenizer_frames_text_as_training_does(exported):
    """AutoTokenizer prepends BOS (the export's post-processor), as titan-train and titan-generate do."""
    ours, theirs = load_tokenizer(None), transformers.AutoTokenizer.from_pretrained(exported)
    for text in TEXTS:
        ids = theirs(text)["input_ids"]
        assert ids == ours.encode(text, bos=True, eos=False), text
        assert theirs.decode(ids, skip_special_tokens=True) == ours.decode(ids) == text
    assert (theirs.bos_token_id, theirs.eos_token_id) == (ours.bos_id, ours.eos_id)


def test_transformers_gives_our_logits(trained, exported):
    model, args, _ = trained
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    assert hf_model.dtype == torch.float32  # from config.json's dtype alone
    tokens = torch.randint(0, args.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(tokens), hf_model(tokens).logits
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)  # reference: LlamaForCausalLM, fp32


def test_bf16_export_loads_and_matches_within_rounding(trained):
    model, args, folder = trained
    out = export(folder / "ckpt", folder / "hf_bf16")  # bfloat16 is the default
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert hf_model.dtype == torch.bfloat16
    tokens = torch.randint(0, args.vocab_size, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours, theirs = model(tokens), hf_model.float()(tokens).logits
    torch.testing.assert_close(theirs, ours, atol=0.05, rtol=0)


def titan_generate(checkpoint: Path, max_new_tokens: int) -> tuple[str, int]:
    """(text, number of new tokens) printed by titan-generate given the checkpoint alone."""
    command = [str(BIN / "titan-generate"), "--checkpoint", str(checkpoint), "--prompt", PROMPT,
               "--max-new-tokens", str(max_new_tokens)]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.rstrip("\n"), int(re.search(r"(\d+) tokens", proc.stderr).group(1))


def test_generate_stops_at_eos_and_equals_titan_generate(trained, exported):
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    prompt = hf_tokenizer(PROMPT, return_tensors="pt")
    out = hf_model.generate(**prompt, max_new_tokens=20, do_sample=False)  # EOS from generation_config.json
    new = out[0, prompt["input_ids"].shape[1] :].tolist()
    assert new[-1] == hf_tokenizer.eos_token_id and len(new) < 20  # stopped at EOS
    expected = PROMPT + hf_tokenizer.decode(new, skip_special_tokens=True)
    assert titan_generate(exported, 20) == (expected, len(new))  # from the HF folder alone
    assert titan_generate(trained[2] / "ckpt", 20) == (expected, len(new))  # from the DCP checkpoint alone


def test_sharded_export_loads_too(trained):
    model, args, folder = trained
    out = export(folder / "ckpt", folder / "hf_sharded", "--dtype", "float32", "--max-shard-size", "100KB")
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 1 and shards[-1] == f"model-{len(shards):05d}-of-{len(shards):05d}.safetensors"
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tokens = torch.randint(0, args.vocab_size, (1, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(hf_model(tokens).logits, model(tokens), atol=1e-4, rtol=0)


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


@pytest.mark.parametrize("flavor", ["8B", "1B"])
def test_export_metadata_carries_the_real_context_length(flavor):
    """An 8B (1B) trained at seq_len 4096 exports max_position_embeddings 131072, from the metadata the
    trainer stores (a meta-device model: no weights needed), and from a fingerprint-only older checkpoint."""
    from titan_train.config import load_config, parse_argv
    from titan_train.run.checkpointing import fingerprint, model_meta

    config = load_config(parse_argv(["--config", str(DEBUG_RECIPE), "--model.flavor", flavor,
                                     "--training.seq_len", "4096"]))  # fmt: skip
    spec = titan_models.get_model_spec("llama3")
    args = dataclasses.replace(spec.args_for(flavor), max_seq_len=max(131072, 4096))
    with torch.device("meta"):
        spec.model_cls(args)  # the shape builds
    meta = {"fingerprint": fingerprint(config, args), "model": model_meta(config, args)}
    hf = adapter_from_meta(meta).hf_config(torch.bfloat16)
    assert hf["max_position_embeddings"] == 131072 and hf["rope_scaling"]["rope_type"] == "llama3"
    assert adapter_from_meta({"fingerprint": meta["fingerprint"]}).hf_config()["max_position_embeddings"] == 131072
    assert hf["tie_word_embeddings"] == (flavor == "1B") and hf["dtype"] == "bfloat16"
    # Untied models keep the fingerprint checkpoints had before tie_word_embeddings existed: they still load.
    assert meta["fingerprint"]["args"].get("tie_word_embeddings", "absent") == (True if flavor == "1B" else "absent")


def test_trainers_export_keeps_the_users_tokenizer_config_byte_for_byte(tmp_path):
    tokenizer_dir = tmp_path / "tokenizer"
    tokenizer_dir.mkdir()
    os.symlink(TOKENIZER, tokenizer_dir / "tokenizer.json")
    user_config = (
        '{"bos_token": "<|begin_of_text|>",  "eos_token": "<|end_of_text|>",\n'
        '  "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 64, "note": "mine"}'
    )
    (tokenizer_dir / "tokenizer_config.json").write_text(user_config)
    dump = tmp_path / "run"
    proc = run_titan(["--config", str(DEBUG_RECIPE), "--model.flavor", "tiny", "--training.seq_len", "32",
                      "--training.local_batch_size", "2", "--training.steps", "2", "--job.dump_folder", str(dump),
                      "--model.tokenizer_path", str(tokenizer_dir), "--checkpoint.enable", "true",
                      "--checkpoint.export_safetensors", "true"], nproc=None)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (dump / "hf" / "tokenizer_config.json").read_text() == user_config
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(dump / "hf")
    assert hf_tokenizer(TEXTS[0])["input_ids"] == load_tokenizer(tokenizer_dir).encode(TEXTS[0], eos=False)
    assert json.loads((dump / "hf" / "config.json").read_text())["max_position_embeddings"] == 512  # tiny's
