"""What the Hugging Face round-trip tests (Llama 3, Qwen3, Qwen3-MoE, DeepSeek-V3) compare against: transformers'
own view of a folder, the reference every model family is checked with; and our model built from it."""

import os
import subprocess
import sys
from pathlib import Path

import torch

# The integration session installs transformers (nox -s integration).
import transformers

from launch_helpers import ROOT, _env, run_titan

BIN = Path(sys.executable).parent
TOKENIZER = ROOT / "packages" / "titan-train" / "src" / "titan_train" / "assets" / "tokenizer.json"


def tokens(seed: int = 0) -> torch.Tensor:
    """Two rows of 40 token ids of the 2048-token vocabulary the tiny test folders use."""
    return torch.randint(0, 2048, (2, 40), generator=torch.Generator().manual_seed(seed))


def ours_from(folder):
    """(model name, our model) built from the folder's config.json alone, its weights loaded."""
    from titan_checkpoint import adapter_from_hf_folder, load_hf_into_model
    from titan_models import get_model_spec

    name, adapter = adapter_from_hf_folder(folder)
    model = get_model_spec(name).model_cls(adapter.args)
    model.init_weights(seed=123)
    load_hf_into_model(model, folder, adapter)
    return name, model


def save_deepseek_v3_folder(config, folder: Path) -> None:
    """A random transformers DeepSeek-V3 of `config` saved to `folder`, its norms and selection biases
    (e_score_correction_bias) moved off their initial values, so a mix-up shows."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.uniform_(-0.05, 0.05)
    model.save_pretrained(folder)


def hf_model(folder) -> torch.nn.Module:
    """The folder as transformers loads it (its config.json's architecture), in float32, for evaluation."""
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def first_batch_loss_by_transformers(folder, dp: int, seq_len: int, batch: int) -> float:
    """The mean loss transformers gives the trainer's first global batch (the dp ranks' rows together)."""
    from titan_train.data import build_dataloader
    from titan_train.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(None)
    rows = [next(iter(build_dataloader(dataset="kjv", dataset_path="", tokenizer=tokenizer, seq_len=seq_len,
                                       local_batch_size=batch, dp_rank=k, dp_world_size=dp, seed=42)))
            for k in range(dp)]  # fmt: skip
    inputs, labels = torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])
    with torch.no_grad():
        logits = hf_model(folder)(inputs).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()).item()


def train_from_folder_and_export(model_name: str, folder: Path, dump: Path, seq_len: int, batch: int) -> list[dict]:
    """3 steps of `model_name` on FSDP 2 from the folder's weights (its config.json as the flavor), checkpointed and
    exported to float32 safetensors at dump/hf; the metrics.jsonl rows."""
    import json

    options = ["--config", str(ROOT / "configs" / "debug_model.toml"), "--model.name", model_name,
               "--model.flavor", f"hf:{folder}", "--checkpoint.initial_load_path", str(folder),
               "--training.seq_len", str(seq_len), "--training.local_batch_size", str(batch),
               "--training.steps", "3", "--metrics.log_freq", "1", "--job.dump_folder", str(dump),
               "--validation.enable", "false", "--checkpoint.enable", "true",
               "--checkpoint.export_safetensors", "true", "--checkpoint.export_dtype", "float32"]  # fmt: skip
    proc = run_titan(options, nproc=2)  # 2 ranks forked with torchrun's variables (forked_ranks)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in (dump / "metrics.jsonl").read_text().splitlines()]


def assert_titan_generate_equals_transformers_greedy(folder: Path, workdir: Path) -> None:
    """`titan-generate --checkpoint` on the folder alone (no recipe, no flavor: its config.json and the
    tokenizer beside it) prints the prompt and transformers' greedy continuation."""
    local = workdir / "hf"
    local.mkdir()
    for file in folder.iterdir():
        os.symlink(file, local / file.name)
    os.symlink(TOKENIZER, local / "tokenizer.json")
    command = [str(BIN / "titan-generate"), "--checkpoint", str(local), "--prompt", "And God said",
               "--max-new-tokens", "12"]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from titan_train.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(None)
    prompt = torch.tensor([tokenizer.encode("And God said", eos=False)])
    greedy = hf_model(folder).generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=tokenizer.eos_id)
    assert proc.stdout.rstrip("\n") == "And God said" + tokenizer.decode(greedy[0, prompt.shape[1] :].tolist())
