"""A run records itself: <dump_folder>/config.toml and run.json, compared on resume; metrics rows carry the
run id and the restart counter."""

import json
import logging

import pytest

from titan_train.config import ConfigError, JobConfig, build_config, load_config, parse_argv, read_toml
from titan_train.run import run_record
from titan_train.run.run_record import RunRecord, record_run
from titan_train.run.trainer import train


def config(dump, **overrides) -> JobConfig:
    return build_config({}, {"job.dump_folder": str(dump), **{k.replace("__", "."): v for k, v in overrides.items()}})


@pytest.fixture
def resuming(monkeypatch):
    """Pretend the dump folder holds a checkpoint to resume from (a real one is made in the end-to-end test)."""
    monkeypatch.setattr(run_record, "will_resume", lambda config: True)


def test_first_start_records_the_resolved_config(tmp_path):
    cfg = config(tmp_path, optimizer__lr="3e-4", training__steps="7")
    record = record_run(cfg, rank=0, world_size=1)
    assert record.restart == 0 and len(record.run_id) == len("20260101-120000-1a2b3c")
    # The record is a recipe that gives back the same config.
    assert load_config(parse_argv(["--config", str(tmp_path / "config.toml")])) == cfg
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["run_id"] == record.run_id and run["restart"] == 0 and run["starts"][0]["world_size"] == 1


def test_other_ranks_write_nothing(tmp_path):
    assert record_run(config(tmp_path), rank=1) is None
    assert not (tmp_path / "config.toml").exists()


def test_resume_with_harmless_changes_warns_and_counts_the_restart(tmp_path, resuming, caplog):
    first = record_run(config(tmp_path), rank=0)
    caplog.set_level(logging.WARNING, logger="titan")
    second = record_run(config(tmp_path, optimizer__lr="1e-4", training__steps="99"), rank=0)
    assert second == RunRecord(first.run_id, 1)
    assert "optimizer.lr 0.0008 -> 0.0001" in caplog.text and "training.steps 50 -> 99" in caplog.text
    assert read_toml(tmp_path / "config.toml")["optimizer"]["lr"] == 1e-4  # the latest start's config
    starts = json.loads((tmp_path / "run.json").read_text())["starts"]
    assert [s["restart"] for s in starts] == [0, 1]
    assert starts[1]["changed"] == {"optimizer.lr": [0.0008, 0.0001], "training.steps": [50, 99]}
    assert record_run(config(tmp_path, optimizer__lr="1e-4", training__steps="99"), rank=0).restart == 2


def test_a_replica_group_restarted_by_torchrun_continues_its_run(tmp_path, monkeypatch):
    """A restarted replica group heals from a live one (no checkpoint in its folder): the same run, restart + 1;
    the same start without fault tolerance, or not restarted, is a new run."""
    ft = {"fault_tolerance__enable": "true"}
    first = record_run(config(tmp_path, **ft), rank=0)
    second = record_run(config(tmp_path, **ft), rank=0)
    assert second.run_id != first.run_id and second.restart == 0  # not restarted by torchrun: a new job
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert record_run(config(tmp_path, **ft), rank=0) == RunRecord(second.run_id, 1)
    assert record_run(config(tmp_path / "plain"), rank=0).restart == 0
    assert record_run(config(tmp_path / "plain"), rank=0).restart == 0


@pytest.mark.parametrize(
    "key, old, new",
    [("model.flavor", "debug", "tiny"), ("training.seq_len", 256, 64), ("model.tokenizer_path", "", "tok.json"),
     ("training.dataset", "kjv", "text")],
)  # fmt: skip
def test_resume_with_a_breaking_change_is_refused_naming_the_key_and_both_values(tmp_path, resuming, key, old, new):
    record_run(config(tmp_path), rank=0)
    before = (tmp_path / "config.toml").read_text()
    with pytest.raises(ConfigError) as error:
        record_run(config(tmp_path, **{key.replace(".", "__"): str(new)}), rank=0)
    message = str(error.value)
    assert f"{key}={new!r} but the run was recorded with {key}={old!r}" in message
    assert "another job.dump_folder" in message
    assert (tmp_path / "config.toml").read_text() == before  # the record is untouched


def test_a_new_run_in_a_used_folder_keeps_the_earlier_record(tmp_path, caplog):
    first = record_run(config(tmp_path, model__flavor="tiny"), rank=0)
    caplog.set_level(logging.WARNING, logger="titan")
    second = record_run(config(tmp_path), rank=0)  # nothing to resume: a new run, whatever changed
    assert second.run_id != first.run_id and second.restart == 0
    assert read_toml(tmp_path / f"config.{first.run_id}.toml")["model"]["flavor"] == "tiny"
    assert read_toml(tmp_path / "config.toml")["model"]["flavor"] == "debug"
    assert f"kept as {tmp_path / f'config.{first.run_id}.toml'}" in caplog.text


def test_resumed_training_appends_rows_with_run_id_and_restart(tmp_path):
    argv = ["--job.dump_folder", str(tmp_path), "--model.flavor", "tiny", "--training.seq_len", "32",
            "--training.local_batch_size", "2", "--metrics.log_freq", "1", "--checkpoint.enable", "true",
            "--checkpoint.interval", "2"]  # fmt: skip
    train(load_config(parse_argv([*argv, "--training.steps", "2"])))
    train(load_config(parse_argv([*argv, "--training.steps", "3"])))  # resumes from step 2
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    run_id = json.loads((tmp_path / "run.json").read_text())["run_id"]
    assert [(r["step"], r["run_id"], r["restart"]) for r in rows] == [(1, run_id, 0), (2, run_id, 0), (3, run_id, 1)]
    with pytest.raises(ConfigError, match="training.seq_len=64 but the run was recorded with training.seq_len=32"):
        train(load_config(parse_argv([*argv, "--training.steps", "4", "--training.seq_len", "64"])))


def test_wandb_logs_the_run_under_its_run_id(tmp_path, monkeypatch):
    import importlib.machinery
    import sys
    import types

    logged, inits = [], []
    wandb = types.ModuleType("wandb")
    wandb.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    run = types.SimpleNamespace(log=lambda values, step: logged.append((step, values)), finish=lambda: None)
    wandb.init = lambda **kwargs: inits.append(kwargs) or run
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    argv = ["--job.dump_folder", str(tmp_path), "--model.flavor", "tiny", "--training.seq_len", "32",
            "--training.local_batch_size", "2", "--training.steps", "2", "--metrics.log_freq", "1",
            "--metrics.enable_wandb", "true", "--metrics.wandb_mode", "offline"]  # fmt: skip
    train(load_config(parse_argv(argv)))
    (init,) = inits
    assert init["id"] == json.loads((tmp_path / "run.json").read_text())["run_id"]
    assert init["mode"] == "offline" and init["dir"] == str(tmp_path) and init["config"]["training"]["steps"] == 2
    assert [step for step, _ in logged] == [1, 2] and "loss" in logged[0][1] and "tps" in logged[0][1]


def test_wandb_without_the_package_is_a_config_error(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match=r"metrics.enable_wandb=true needs the wandb package: pip install"):
        load_config(parse_argv(["--metrics.enable_wandb", "true"]))
