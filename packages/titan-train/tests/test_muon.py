"""optimizer.name = "Muon" through the trainer on one process: which parameters Muon takes, the step line,
learning, exact resume, and the config's checks."""

import json
from pathlib import Path

import pytest
import torch

from titan_checkpoint import complete_steps
from titan_models import get_model_spec
from titan_train.cli import train as cli
from titan_train.config import ConfigError, load_config, parse_argv
from titan_train.config.model_args import model_args
from titan_train.run.distributed import init_distributed
from titan_train.run.muon_params import split_params
from titan_train.run.optim import lr_factor
from titan_train.run.trainer import Trainer

ROOT = Path(__file__).resolve().parents[3]
GIB = 1024**3
MUON = ["--optimizer.name", "Muon"]
TINY = ["--model.flavor", "tiny", "--training.seq_len", "32", "--training.local_batch_size", "2",
        "--training.deterministic", "true", "--metrics.log_freq", "1000",
        "--lr_scheduler.warmup_steps", "2"]  # fmt: skip


def trainer(tmp_path, *overrides: str) -> Trainer:
    config = load_config(parse_argv(["--job.dump_folder", str(tmp_path), *overrides]))
    return Trainer(config, init_distributed(config))


def group_names(t) -> tuple[set[str], set[str]]:
    """The parameter names of the one optimizer's AdamW group and Muon group."""
    (optimizer,) = t.optimizer.optimizers
    names = {p: n for n, p in t.model.named_parameters()}
    adamw_group, muon_group = optimizer.param_groups
    return tuple({names[p] for p in group["params"]} for group in (adamw_group, muon_group))


def split_line(caplog) -> str:
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("optimizer: Muon for")]
    return line


def test_the_rule_is_the_models_plan_unless_configured(tmp_path, caplog):
    """Qwen3-Next: its plan sends the linear attention's depthwise convolution ([channels, 1, kernel], 3-D) and the
    shared experts' gate to AdamW, which a rule blind to the family would give Muon (as a stack of matrices)."""
    with caplog.at_level("INFO", logger="titan"):
        t = trainer(tmp_path, *TINY, *MUON, "--model.name", "qwen3_next", "--training.steps", "1")
    rule = get_model_spec("qwen3_next").plan(t.model_args).adamw_params
    assert {"conv1d", "shared_expert_gate", "router"} <= set(rule)
    assert split_line(caplog).endswith(f"names matching {list(rule)} (the model's plan)")
    adamw, muon = group_names(t)
    assert "layers.0.linear_attn.conv1d.weight" in adamw and "layers.0.feed_forward.shared_expert_gate.weight" in adamw
    assert "layers.0.feed_forward.experts.w1" in muon and "layers.0.linear_attn.in_proj_qkvz.weight" in muon


def test_a_configured_rule_replaces_the_plans(tmp_path, caplog):
    """`--optimizer.adamw_params "layers.0.*"`: the output head goes to Muon, layer 0's matrices to AdamW, and the
    startup line names the configured rule as its source."""
    with caplog.at_level("INFO", logger="titan"):
        t = trainer(tmp_path, *TINY, *MUON, "--optimizer.adamw_params", "layers.0.*", "--training.steps", "1")
    assert split_line(caplog).endswith("names matching ['layers.0.*'] (optimizer.adamw_params)")
    adamw, muon = group_names(t)
    assert {"output.weight", "tok_embeddings.weight", "layers.1.attention.wq.weight"} <= muon
    assert {"layers.0.attention.wq.weight", "layers.1.attention_norm.weight"} <= adamw  # 1-D: AdamW whatever rule


def test_the_split_is_logged_once_and_every_parameter_has_one_optimizer(tmp_path, caplog):
    with caplog.at_level("INFO", logger="titan"):
        t = trainer(tmp_path, *TINY, *MUON, "--training.steps", "1")
    line = split_line(caplog)
    muon, adamw = split_params(t.model, t.spec.plan(t.model_args).adamw_params)
    (optimizer,) = t.optimizer.optimizers
    adamw_group, muon_group = optimizer.param_groups
    assert [p for _, p in muon] == muon_group["params"] and [p for _, p in adamw] == adamw_group["params"]
    assert f"Muon for {len(muon)} tensors" in line
    assert (adamw_group["lr"], muon_group["lr"]) == pytest.approx((8e-4 / 2, 0.02 / 2))  # warmup: 1 step in 1


def test_debug_model_learns_with_muon(tmp_path):
    """`titan-train --config configs/debug_model.toml --optimizer.name Muon --training.steps 20`, on shorter
    sequences."""
    overrides = ["--config", str(ROOT / "configs/debug_model.toml"), *MUON, "--training.steps", "20",
                 "--training.seq_len", "64", "--training.local_batch_size", "4", "--validation.enable", "false",
                 "--metrics.log_freq", "1000"]  # fmt: skip
    losses = trainer(tmp_path, *overrides).train()
    # The bar comes from the run itself: a model that learns nothing stays near its first loss (measured:
    # the last three average 0.88 of the first).
    assert sum(losses[-3:]) / 3 < 0.92 * losses[0], losses


def test_the_muon_recipe_validates():
    config = load_config(parse_argv(["--config", str(ROOT / "configs/debug_model_muon.toml")]))
    assert (config.optimizer.name, config.optimizer.muon_lr, config.model.flavor) == ("Muon", 0.05, "debug")


def test_resume_with_muon_gives_bit_identical_losses(tmp_path):
    """As test_checkpointing's AdamW case: the momentum buffers and AdamW's moments come back exactly."""
    straight = trainer(tmp_path / "a", *TINY, *MUON, "--training.steps", "6").train()
    ckpt = [*TINY, *MUON, "--checkpoint.enable", "true", "--checkpoint.interval", "3", "--training.steps", "6"]
    first = trainer(tmp_path / "b", *ckpt)
    first.config.training.steps = 3  # a run cut off after step 3 (its schedule still spans 6 steps)
    part1 = first.train()
    resumed = trainer(tmp_path / "b", *ckpt)
    assert resumed.step_count == 3
    state = resumed.optimizer.optimizers[0].state
    assert any("momentum_buffer" in s for s in state.values()) and any("exp_avg" in s for s in state.values())
    assert part1 + resumed.train() == straight
    assert complete_steps(tmp_path / "b" / "checkpoint") == [3, 6]


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("muon_momentum", "1.0", "optimizer.muon_momentum=1.0 must be in [0, 1)"),
        ("muon_ns_steps", "0", "optimizer.muon_ns_steps=0 must be in 1..99"),
        ("muon_lr", "0", "optimizer.muon_lr=0.0 must be > 0"),
        ("muon_weight_decay", "-1", "optimizer.muon_weight_decay=-1.0 must be >= 0"),
    ],
)
def test_bad_muon_values_name_the_field(key, value, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(")", r"\)").replace(".", r"\.")):
        load_config(parse_argv([*MUON, f"--optimizer.{key}", value]))


def test_an_unknown_lr_adjustment_is_refused():
    with pytest.raises(ConfigError, match="muon_adjust_lr_fn"):
        load_config(parse_argv([*MUON, "--optimizer.muon_adjust_lr_fn", "sqrt"]))


def test_metrics_keep_lr_as_adamws_and_add_each_optimizers(tmp_path):
    """metrics.jsonl: `lr` as with AdamW alone (the key scripts read), and lr_adamw / lr_muon, the values the
    scheduler set in each group (LambdaLR: the group's peak times lr_factor)."""
    t = trainer(tmp_path, *TINY, *MUON, "--training.steps", "4", "--metrics.log_freq", "1")
    t.train()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for row in rows:
        factor = lr_factor(row["step"] - 1, 4, t.config.lr_scheduler)
        assert row["lr"] == row["lr_adamw"] == 8e-4 * factor
        assert row["lr_muon"] == 0.02 * factor


def test_the_dry_run_names_muons_state_bytes_exactly(tmp_path, capsys):
    """The debug Muon recipe on FSDP 2: each rank holds half of one float32 momentum buffer per Muon matrix,
    half of AdamW's two moments for the rest, and a float32 step counter per AdamW tensor (fused, as on CUDA)."""
    return_code = cli.main(["--dry-run", "--job.dump_folder", str(tmp_path), "--config",
                            str(ROOT / "configs/debug_model_muon.toml"), "--world-size", "2",
                            "--training.seq_len", "64", "--training.local_batch_size", "1"])  # fmt: skip
    assert return_code == 0
    (entry,) = json.loads((tmp_path / "dry_run.json").read_text())["rank_classes"]
    config = load_config(parse_argv(["--config", str(ROOT / "configs/debug_model_muon.toml")]))
    with torch.device("meta"):
        model = get_model_spec(config.model.name).model_cls(model_args(config))
    muon, adamw = split_params(model, get_model_spec(config.model.name).plan(model_args(config)).adamw_params)
    muon_bytes = sum(p.numel() for _, p in muon) * 4 // 2
    adamw_bytes = 2 * sum(p.numel() for _, p in adamw) * 4 // 2 + 4 * len(adamw)
    assert (entry["optimizer_muon_gib"] * GIB, entry["optimizer_adamw_gib"] * GIB) == (muon_bytes, adamw_bytes)
    assert entry["optimizer_gib"] * GIB == muon_bytes + adamw_bytes
    out = capsys.readouterr().out
    muon_gib, adamw_gib = muon_bytes / GIB, adamw_bytes / GIB
    assert f"optim = Muon momentum {muon_gib:.2f} GiB + AdamW {adamw_gib:.2f} GiB" in out
