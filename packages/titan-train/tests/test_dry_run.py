"""`titan-train --dry-run --world-size N`: the real model, parallelize path and training steps on a fake process
group and fake tensors, one simulated rank per rank class; the per-class memory report."""

import json
import pathlib

import pytest
import torch

from titan_models import get_model_spec
from titan_train import cli
from titan_train import train as train_module

ROOT = pathlib.Path(__file__).resolve().parents[3]
GIB = 1024**3
KEYS = {
    "ranks", "peak_active_gib", "peak_reserved_gib", "peak_op", "peak_phase", "params_gib", "grads_gib",
    "optimizer_gib", "activations_gib", "flops_per_step",
}  # fmt: skip


def _dry_run(tmp_path, *args: str) -> tuple[dict, str]:
    return_code = cli.main(["--dry-run", "--job.dump_folder", str(tmp_path), *args])
    assert return_code == 0
    return json.loads((tmp_path / "dry_run.json").read_text())


def test_debug_model_on_fsdp_tp_pp_reports_first_and_last_stage_classes(tmp_path, capsys, monkeypatch):
    def not_in_a_dry_run(*args, **kwargs):
        raise AssertionError("a dry run builds no tokenizer and no dataloader")

    monkeypatch.setattr(train_module, "load_tokenizer", not_in_a_dry_run)
    monkeypatch.setattr(train_module, "build_dataloader", not_in_a_dry_run)
    report = _dry_run(
        tmp_path, "--config", str(ROOT / "configs/debug_model.toml"), "--world-size", "8",
        "--parallelism.tensor_parallel_degree", "2", "--parallelism.pipeline_parallel_degree", "2",
    )  # fmt: skip
    out = capsys.readouterr().out
    # The layout line comes first, as before the simulation existed; then the table.
    assert out.index("# layout: world 8 = dp_replicate 1 x dp_shard 2 x cp 1 x tp 2 x pp 2") < out.index("# dry run")
    assert report["world_size"] == 8
    first, last = report["rank_classes"]
    assert first["ranks"] == [0, 1, 2, 3] and last["ranks"] == [4, 5, 6, 7]
    assert "first" in first["name"] and "last" in last["name"]
    for entry in (first, last):
        assert KEYS <= entry.keys()
        held = entry["params_gib"] + entry["grads_gib"] + entry["optimizer_gib"]
        assert entry["peak_reserved_gib"] >= entry["peak_active_gib"] > held > 0
        assert entry["activations_gib"] > 0 and entry["flops_per_step"] > 0
        assert entry["peak_phase"].split(".")[-1] in ("forward", "loss", "loss_backward", "backward", "optimizer")
    assert first["stages"] == [0] and last["stages"] == [1]
    assert any(u.startswith("pipeline P2P") for u in report["unmodelled"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--world-size", "0"], "--world-size 0: must be > 0"),
        (["--world-size", "two"], "--world-size 'two' is not a whole number"),
        (["--world-size", "3", "--parallelism.tensor_parallel_degree", "2"], "world size 3 is not divisible"),
        (["--world-size", "2"], "--world-size is for --dry-run"),
    ],
)
def test_a_bad_world_size_is_a_config_error_before_any_work(args, message, capsys):
    dry = [] if "--world-size is for --dry-run" in message else ["--dry-run"]
    assert cli.main(["--config", str(ROOT / "configs/debug_model.toml"), *dry, *args]) == 2
    err = capsys.readouterr().err
    assert "config error" in err and message in err


def test_the_paper_table_1_fsdp_row_runs_end_to_end_with_exact_state_bytes(tmp_path, capsys):
    """Llama 3.1 8B on 8 GPUs (configs/paper/t1_fsdp.toml): what its dry run holds follows from FSDP alone."""
    report = _dry_run(tmp_path, "--config", str(ROOT / "configs/paper/t1_fsdp.toml"), "--world-size", "8")
    (entry,) = report["rank_classes"]
    assert entry["ranks"] == list(range(8))
    spec = get_model_spec("llama3")
    args = spec.args_for("8B")
    n_params = _parameter_count(spec, args)
    # FSDP over 8: each rank holds an eighth of the float32 parameters, their gradients and two AdamW moments.
    assert entry["params_gib"] * GIB == n_params * 4 / 8
    assert entry["grads_gib"] == entry["params_gib"]
    assert entry["optimizer_gib"] == 2 * entry["params_gib"]
    assert entry["peak_active_gib"] > entry["params_gib"] + entry["grads_gib"] + entry["optimizer_gib"]
    # float32 logits of 2 x 8192 tokens x 128256: their log-softmax backward is the peak, and the warning says so
    assert entry["peak_phase"] == "loss_backward"
    assert any("training.loss_chunk_tokens" in warning for warning in entry["warnings"])
    assert "# dry run: world size 8" in capsys.readouterr().out


def _parameter_count(spec, args) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in spec.model_cls(args).parameters())
