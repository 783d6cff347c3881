"""The dry run shows what LoRA saves: with the base frozen, a rank holds gradients and optimizer state for its
share of the adapters only, to the byte."""

import json
import pathlib

import torch
from torch import nn

from titan_models import get_model_spec
from titan_train.cli import train as cli
from titan_train.config import load_config, parse_argv
from titan_train.config.model_args import model_args
from titan_train.lora.adapters import targeted

ROOT = pathlib.Path(__file__).resolve().parents[3]
GIB = 1024**3
DEBUG = ["--config", str(ROOT / "configs/debug_model.toml"), "--lora.enable", "true"]


def test_the_dry_run_holds_gradients_and_adamw_state_for_the_adapters_only(tmp_path):
    """The debug model on FSDP 2 (fused AdamW, as on CUDA): each rank holds half of the adapters' float32
    gradients, half of their two moments and a float32 step counter per adapter tensor; nothing for the base."""
    return_code = cli.main(["--dry-run", "--job.dump_folder", str(tmp_path), *DEBUG, "--world-size", "2",
                            "--training.seq_len", "64", "--training.local_batch_size", "1"])  # fmt: skip
    assert return_code == 0
    (entry,) = json.loads((tmp_path / "dry_run.json").read_text())["rank_classes"]

    config = load_config(parse_argv(DEBUG))
    with torch.device("meta"):
        model = get_model_spec(config.model.name).model_cls(model_args(config))
    lora = config.lora
    adapted = [m for fqn, m in model.named_modules() if isinstance(m, nn.Linear) and targeted(fqn, lora.target_modules)]
    adapter_elements = sum(lora.rank * (m.in_features + m.out_features) for m in adapted)  # A: r x in, B: out x r
    base_bytes = sum(p.numel() for p in model.parameters()) * 4 // 2
    adapter_bytes = adapter_elements * 4 // 2
    assert entry["params_gib"] * GIB == base_bytes + adapter_bytes
    assert entry["grads_gib"] * GIB == adapter_bytes
    assert entry["optimizer_gib"] * GIB == 2 * adapter_bytes + 4 * 2 * len(adapted)
    # Without LoRA every parameter has a gradient and two moments: about 63x the adapters' bytes here.
    assert base_bytes > 50 * adapter_bytes
