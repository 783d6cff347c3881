"""CheckpointManager on one process: exact resume, retention, load selection, model-only and seed saves,
fingerprints, async saves."""

import logging
import threading

import ckpt_toy
import pytest
import torch
from ckpt_toy import params, toy_run

from titan_checkpoint import (
    CheckpointConfig,
    CheckpointError,
    CheckpointMismatchError,
    complete_steps,
    read_meta,
    save_seed_checkpoint,
)
from titan_checkpoint.storage import ChecksumWriter, read_dcp_metadata


@pytest.mark.parametrize("async_mode", ["disabled", "async"])
def test_resume_continues_exactly_as_if_never_stopped(tmp_path, async_mode):
    config = CheckpointConfig(interval=3, async_mode=async_mode)
    first = toy_run(tmp_path, config=config)
    losses = []
    for step in range(1, 7):
        losses.append(first.step())
        first.manager.save(step, last=step == 6)
    first.manager.close()

    # Different init and data seed: everything must come from the checkpoint.
    second = toy_run(tmp_path, seed=1, config=CheckpointConfig(interval=3, load_step=3))
    assert second.manager.load() == 3
    assert [second.step() for _ in range(3)] == losses[3:]
    for name, value in params(second.model).items():
        assert torch.equal(value, params(first.model)[name]), name
    assert second.scheduler.state_dict() == first.scheduler.state_dict()


def test_async_save_holds_the_state_of_its_step(tmp_path):
    run = toy_run(tmp_path, config=CheckpointConfig(interval=1, async_mode="async"))
    run.step()
    expected = params(run.model)
    run.manager.save(1)
    with torch.no_grad():  # the next steps change the parameters while the save may still be writing
        for p in run.model.parameters():
            p.add_(1.0)
    run.manager.close()
    fresh = toy_run(tmp_path, seed=5)
    assert fresh.manager.load() == 1
    for name, value in params(fresh.model).items():
        assert torch.equal(value, expected[name]), name


def test_pinned_memory_on_cpu_falls_back_to_async_and_says_so(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="titan.checkpoint"):
        run = toy_run(tmp_path, config=CheckpointConfig(async_mode="async_with_pinned_mem"))
    assert run.manager.async_mode == "async"
    assert "pinned memory needs an accelerator" in caplog.text
    run.step()
    run.manager.save(1, last=True)
    run.manager.close()
    assert complete_steps(tmp_path) == [1]


def test_interval_decides_when_to_save(tmp_path):
    run = toy_run(tmp_path, config=CheckpointConfig(interval=2, keep_latest_k=0))
    saved = [run.manager.save(step, last=step == 5) for step in range(1, 6)]
    assert saved == [False, True, False, True, True]
    assert run.manager.save(5, last=True) is False  # already saved
    assert complete_steps(tmp_path) == [2, 4, 5]


def test_keep_latest_k_removes_older_checkpoints(tmp_path):
    run = toy_run(tmp_path, config=CheckpointConfig(interval=1, keep_latest_k=2, async_mode="async"))
    for step in range(1, 6):
        run.step()
        run.manager.save(step)
    run.manager.close()
    assert complete_steps(tmp_path) == [4, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-4", "step-5"]


def test_keep_latest_k_never_removes_the_checkpoint_just_saved(tmp_path):
    run = toy_run(tmp_path, config=CheckpointConfig(interval=1, keep_latest_k=2))
    for step in (10, 20, 5):  # resumed from an earlier step, below the abandoned later ones
        run.manager.save(step)
    assert complete_steps(tmp_path) == [5, 10, 20]
    run.manager.save(6)
    assert complete_steps(tmp_path) == [6, 10, 20]


def test_load_picks_the_latest_or_the_requested_step(tmp_path):
    run = toy_run(tmp_path, config=CheckpointConfig(interval=1, keep_latest_k=0))
    for step in range(1, 4):
        run.step()
        run.manager.save(step)
    assert toy_run(tmp_path).manager.load() == 3
    assert toy_run(tmp_path).manager.load(step=2) == 2
    with pytest.raises(
        CheckpointError, match=r"load_step=7: .*step-7 is not a complete checkpoint; complete steps .*: 1, 2, 3"
    ):
        toy_run(tmp_path, config=CheckpointConfig(load_step=7)).manager.load()


def test_empty_folder_is_a_fresh_start(tmp_path):
    run = toy_run(tmp_path / "none")
    before = params(run.model)
    assert run.manager.load() == 0
    assert all(torch.equal(v, before[k]) for k, v in params(run.model).items())


def test_exclude_from_loading_keeps_the_current_state(tmp_path):
    run = toy_run(tmp_path)
    for _ in range(3):
        run.step()
    run.manager.save(3)
    resumed = toy_run(tmp_path, config=CheckpointConfig(exclude_from_loading=["dataloader"]))
    assert resumed.manager.load() == 3
    assert resumed.data.position == 0
    assert torch.equal(resumed.model.out.weight, run.model.out.weight)


def test_per_rank_state_of_a_missing_rank_is_refused_unless_excluded(tmp_path):
    run = toy_run(tmp_path, data_rank=0)
    run.manager.save(3)
    other_rank = toy_run(tmp_path, data_rank=1)
    with pytest.raises(
        CheckpointMismatchError, match=r"dataloader state for rank0 but not for rank1: .*exclude_from_loading"
    ):
        other_rank.manager.load()
    excluded = toy_run(tmp_path, data_rank=1, config=CheckpointConfig(exclude_from_loading=["dataloader"]))
    assert excluded.manager.load() == 3


def test_different_model_config_is_refused_naming_the_fields(tmp_path):
    toy_run(tmp_path).manager.save(3)
    other = ckpt_toy.fingerprint(ckpt_toy.ToyArgs(dim=8))
    other["flavor"] = "small"
    with pytest.raises(CheckpointMismatchError) as error:
        toy_run(tmp_path, model_fingerprint=other).manager.load()
    message = str(error.value)
    assert "was written by a run with a different model config" in message
    assert "args.dim: checkpoint 16, this run 8" in message and "flavor: checkpoint 'test', this run 'small'" in message
    # The override (same shapes here, so the load itself succeeds).
    assert (
        toy_run(tmp_path, model_fingerprint=other, config=CheckpointConfig(check_fingerprint=False)).manager.load() == 3
    )


def test_model_only_final_save_is_in_export_dtype_and_cannot_resume(tmp_path):
    config = CheckpointConfig(interval=2, model_only=True, export_dtype="bfloat16")
    run = toy_run(tmp_path / "run", config=config)
    run.step()
    run.manager.save(2)
    run.manager.save(3, last=True)
    meta = read_meta(tmp_path / "run" / "step-3")
    assert meta["model_only"] and meta["contents"] == ["model"] and meta["model_dtype"] == "bfloat16"
    saved = read_dcp_metadata(tmp_path / "run" / "step-3").state_dict_metadata
    assert {info.properties.dtype for info in saved.values()} == {torch.bfloat16}
    assert not read_meta(tmp_path / "run" / "step-2")["model_only"]

    with pytest.raises(CheckpointError, match=r"holds only model weights .* load_step to a complete checkpoint \(2\)"):
        toy_run(tmp_path / "run").manager.load()
    fine_tune = toy_run(
        tmp_path / "new", seed=3, config=CheckpointConfig(initial_load_path=str(tmp_path / "run" / "step-3"))
    )
    assert fine_tune.manager.load() == 0
    assert torch.equal(fine_tune.model.out.weight, run.model.out.weight.to(torch.bfloat16).float())


def test_seed_checkpoint_starts_a_run(tmp_path):
    model, _, _ = ckpt_toy.build(seed=7)
    path = save_seed_checkpoint(tmp_path, model, fingerprint=ckpt_toy.fingerprint())
    assert path == tmp_path / "step-0" and read_meta(path)["model_only"]
    run = toy_run(tmp_path, seed=0)
    assert run.manager.load() == 0
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in params(run.model).items())
    run.step()  # the optimizer starts fresh
    run.manager.save(3)
    assert complete_steps(tmp_path) == [0, 3]


def test_failed_async_save_raises_on_wait_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    run = toy_run(tmp_path, config=CheckpointConfig(interval=1, async_mode="async"))
    run.manager.save(1)
    run.manager.wait()

    def broken_write(self, plan, planner):
        raise OSError("disk full")

    monkeypatch.setattr(ChecksumWriter, "write_data", broken_write)
    run.manager.save(2)
    with pytest.raises(CheckpointError, match=r"disk full"):
        run.manager.wait()
    assert complete_steps(tmp_path) == [1]
    assert toy_run(tmp_path).manager.load() == 1


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("async_mode", "fast", "checkpoint.async_mode='fast'; use one of disabled, async, async_with_pinned_mem"),
        ("keep_latest_k", -1, "checkpoint.keep_latest_k=-1 must be an integer >= 0"),
        ("initial_load_format", "gguf", "checkpoint.initial_load_format='gguf'; use one of dcp, hf"),
        ("export_dtype", "int8", "checkpoint.export_dtype='int8'; use one of float32, bfloat16, float16"),
    ],
)
def test_config_errors_name_field_value_and_choices(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        CheckpointConfig(**{field: value}).validate()


def test_async_save_returns_while_its_files_are_still_being_written(tmp_path, monkeypatch):
    """The storage layer holds every write until the training loop has run a step after save() returned:
    a save that wrote in the calling thread would still be waiting inside save() (and find the gate
    shut until the timeout), and its step would be complete before the next training step."""
    from titan_checkpoint import storage

    gate, held = threading.Event(), threading.Event()
    write = storage._Crc32Stream.write

    def gated_write(self, data):
        held.set()
        if not gate.wait(timeout=30):
            gate.set()  # a synchronous save waits here once, not once per write
        return write(self, data)

    run = toy_run(tmp_path, config=CheckpointConfig(interval=1, async_mode="async"))
    run.step()
    expected = params(run.model)
    monkeypatch.setattr(storage._Crc32Stream, "write", gated_write)
    run.manager.save(1)
    saved_before_the_next_step = complete_steps(tmp_path)
    run.step()  # training goes on while the write is in flight
    assert held.wait(timeout=20), "the save never reached the storage layer"
    assert saved_before_the_next_step == [] and complete_steps(tmp_path) == []
    gate.set()
    run.manager.close()
    assert complete_steps(tmp_path) == [1]
    fresh = toy_run(tmp_path, seed=5)
    assert fresh.manager.load() == 1
    for name, value in params(fresh.model).items():
        assert torch.equal(value, expected[name]), name
