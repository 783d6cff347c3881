"""The trainer as users launch it, at world size 1 (later issues add the parallel layouts)."""

import pytest

from launch_helpers import DEBUG_RECIPE, read_metrics, run_titan
from titan_train.config import load_config, parse_argv

METRIC_KEYS = {"step", "loss", "grad_norm", "lr", "tps", "mfu", "memory"}


def test_torchrun_module_writes_step_lines_and_metrics(tmp_path, tiny_args):
    proc = run_titan([*tiny_args, "--training.steps", "4"], nproc=1, torchrun=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    step_lines = [line for line in proc.stdout.splitlines() if "loss" in line and "step" in line]
    assert len(step_lines) == 4, proc.stdout
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(METRIC_KEYS <= r.keys() for r in records)
    # The run records itself: the config it ran with, and its id on every row.
    recorded = load_config(parse_argv(["--config", str(tmp_path / "run" / "config.toml")]))
    assert recorded == load_config(parse_argv([*tiny_args, "--training.steps", "4"]))
    assert {(r["run_id"], r["restart"]) for r in records} == {(records[0]["run_id"], 0)}


def test_console_entry_point_appends_to_existing_metrics(tmp_path, tiny_args):
    first = run_titan([*tiny_args, "--training.steps", "2"], nproc=None)
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_titan([*tiny_args, "--training.steps", "1"], nproc=None)
    assert second.returncode == 0, second.stderr[-3000:]
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 1]
    # Nothing to resume: the second start is a new run, told apart by its id; the first one's record is kept.
    assert rows[0]["run_id"] == rows[1]["run_id"] != rows[2]["run_id"]
    assert (tmp_path / "run" / f"config.{rows[0]['run_id']}.toml").is_file()


def test_bad_config_fails_fast_and_writes_nothing(tmp_path):
    proc = run_titan(
        ["--config", str(DEBUG_RECIPE), "--job.dump_folder", str(tmp_path / "run"), "--training.local_batch_sise", "4"],
        nproc=1,
    )
    assert proc.returncode != 0
    assert "did you mean 'training.local_batch_size'" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_unsupported_layout_fails_with_its_message(tmp_path, tiny_args):
    proc = run_titan([*tiny_args, "--parallelism.tensor_parallel_degree", "3"], nproc=1)
    assert proc.returncode != 0
    # A degree the model cannot take is reported as such (not as a world-size mismatch), in the config's keys.
    assert "parallelism.tensor_parallel_degree=3 does not divide n_heads=4 (model.flavor='tiny'); use 1 or 2" in (
        proc.stderr
    )


@pytest.mark.slow
def test_debug_recipe_trains_as_the_readme_says(tmp_path):
    proc = run_titan(["--config", str(DEBUG_RECIPE), "--job.dump_folder", str(tmp_path / "run")], nproc=None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [r["loss"] for r in read_metrics(tmp_path / "run")]
    assert losses[-1] < 0.8 * losses[0], losses
