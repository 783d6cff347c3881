"""save_checkpoint / load_checkpoint: one checkpoint written or read without a CheckpointManager, in the
manager's format, so each reads what the other wrote."""

import logging

import ckpt_toy
import pytest
import torch
from ckpt_toy import params, toy_run

from titan_checkpoint import (
    CheckpointMismatchError,
    ModelState,
    OptimizerState,
    complete_steps,
    load_checkpoint,
    read_meta,
    save_checkpoint,
)
from titan_checkpoint.storage import read_dcp_metadata, verify_files


def test_model_only_round_trip_in_the_managers_format(tmp_path):
    model, _, _ = ckpt_toy.build(seed=7)
    path = save_checkpoint(tmp_path, 5, {"model": ModelState(model)}, fingerprint=ckpt_toy.fingerprint())
    assert path == tmp_path / "step-5" and complete_steps(tmp_path) == [5]
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # renamed from .step-5.tmp
    meta = read_meta(path)
    assert meta["contents"] == ["model"] and meta["model_only"] and meta["step"] == 5
    assert meta["fingerprint"] == ckpt_toy.fingerprint() and meta["world_size"] == 1
    assert meta["files"] and verify_files(path, read_dcp_metadata(path), meta["files"]) == []  # sizes, CRC-32s

    fresh, _, _ = ckpt_toy.build(seed=1)
    assert load_checkpoint(tmp_path, {"model": ModelState(fresh)}) == 5  # a folder of steps: the latest
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in params(fresh).items())


def test_full_states_resume_a_run(tmp_path):
    run = toy_run(tmp_path / "a")
    run.step()
    save_checkpoint(tmp_path / "b", 1, run.manager.states, fingerprint=ckpt_toy.fingerprint())  # RNG included
    expected = run.step()
    resumed = toy_run(tmp_path / "b", seed=3)
    assert resumed.manager.load() == 1
    assert resumed.step() == expected


def test_loads_the_weights_from_a_managers_full_checkpoint(tmp_path):
    run = toy_run(tmp_path)
    run.step()
    run.manager.save(3)
    model, optimizer, _ = ckpt_toy.build(seed=4)
    assert load_checkpoint(tmp_path / "step-3", {"model": ModelState(model)}) == 3
    assert all(torch.equal(v, params(run.model)[k]) for k, v in params(model).items())


def test_refuses_states_the_checkpoint_lacks(tmp_path):
    model, optimizer, _ = ckpt_toy.build()
    path = save_checkpoint(tmp_path, 1, {"model": ModelState(model)})
    with pytest.raises(CheckpointMismatchError, match=r"holds no 'optimizer' state \(it holds model\)"):
        load_checkpoint(path, {"model": ModelState(model), "optimizer": OptimizerState(model, optimizer)})


def test_fingerprint_refused_or_warned(tmp_path, caplog):
    model, _, _ = ckpt_toy.build()
    save_checkpoint(tmp_path, 0, {"model": ModelState(model)}, fingerprint=ckpt_toy.fingerprint())
    other = ckpt_toy.fingerprint(ckpt_toy.ToyArgs(dim=32))
    with pytest.raises(CheckpointMismatchError, match=r"args.dim: checkpoint 16, this run 32"):
        load_checkpoint(tmp_path, {"model": ModelState(model)}, fingerprint=other)
    with caplog.at_level(logging.WARNING, logger="titan.checkpoint"):
        load_checkpoint(tmp_path, {"model": ModelState(model)}, fingerprint=other, strict_fingerprint=False)
    assert "different model config" in caplog.text
