"""Damaged checkpoints raise errors that name the file; nothing loaded runs pickled code."""

import json
import os
import pickle

import ckpt_toy
import pytest
import torch
import torch.distributed.checkpoint as dcp
from ckpt_toy import toy_run

from titan_checkpoint import CheckpointConfig, CheckpointCorruptError, CheckpointError, CheckpointManager, ModelState
from titan_checkpoint.storage import read_dcp_metadata


@pytest.fixture
def saved(tmp_path):
    """A complete checkpoint at step 3 of the toy run; returns its folder."""
    run = toy_run(tmp_path)
    run.step()
    run.manager.save(3)
    return tmp_path / "step-3"


def data_file(step_folder):
    return next(step_folder.glob("*.distcp"))


def test_truncated_data_file_is_named(saved):
    file = data_file(saved)
    os.truncate(file, file.stat().st_size // 2)
    with pytest.raises(
        CheckpointCorruptError, match=rf"{file} is \d+ bytes but \d+ were written; the file is truncated"
    ):
        toy_run(saved.parent).manager.load()


def test_flipped_bytes_fail_the_checksum_naming_the_file(saved):
    file = data_file(saved)
    data = bytearray(file.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4] = bytes(b ^ 0xFF for b in data[middle : middle + 4])
    file.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorruptError, match=rf"{file} fails its CRC-32 check"):
        toy_run(saved.parent).manager.load()


def test_missing_data_file_is_named(saved):
    file = data_file(saved)
    file.unlink()
    with pytest.raises(CheckpointCorruptError, match=rf"{file} is missing"):
        toy_run(saved.parent).manager.load()


def test_truncated_metadata_is_named(saved):
    metadata = saved / ".metadata"
    os.truncate(metadata, 100)
    with pytest.raises(CheckpointCorruptError, match=rf"{metadata} cannot be read .*corrupt or truncated"):
        toy_run(saved.parent).manager.load()


def test_step_folder_without_its_meta_file_is_an_error_not_a_fresh_start(saved):
    (saved / "titan_meta.json").unlink()
    with pytest.raises(
        CheckpointCorruptError, match=r"titan_meta.json is missing: .*step-3 was not written by a complete save"
    ):
        toy_run(saved.parent).manager.load()


def test_corrupt_meta_file_is_named(saved):
    (saved / "titan_meta.json").write_text('{"format": "titan-checkpoint/1", "step": ')
    with pytest.raises(CheckpointCorruptError, match=r"titan_meta.json cannot be read"):
        toy_run(saved.parent).manager.load()


def test_plain_dcp_checkpoint_is_checked_against_its_metadata(tmp_path):
    """A DCP folder written without titan-checkpoint (no checksums): sizes still checked, file named."""
    model, _, _ = ckpt_toy.build()
    dcp.save({"model": model.state_dict()}, checkpoint_id=tmp_path / "plain", no_dist=True)
    file = data_file(tmp_path / "plain")
    os.truncate(file, file.stat().st_size - 10)
    config = CheckpointConfig(initial_load_path=str(tmp_path / "plain"))
    manager = CheckpointManager(tmp_path / "run", {"model": ModelState(model)}, config)
    with pytest.raises(
        CheckpointCorruptError, match=rf"{file} is truncated: \d+ bytes, but .metadata places data up to"
    ):
        manager.load()


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_metadata_with_code_is_refused_without_running_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / ".metadata").write_bytes(pickle.dumps(_Boom()))
    with pytest.raises(CheckpointCorruptError, match=r"\w+\.system is not part of DCP checkpoint metadata"):
        read_dcp_metadata(tmp_path / "evil")
    assert not (tmp_path / "pwned").exists()


class _Custom:
    pass


class _HoldsAnObject:
    def state_dict(self):
        return {"thing": _Custom()}

    def load_state_dict(self, state):
        pass


def test_non_plain_values_are_not_unpickled_on_load(tmp_path):
    model, _, _ = ckpt_toy.build()
    states = {"model": ModelState(model), "extra": _HoldsAnObject()}
    CheckpointManager(tmp_path, states, CheckpointConfig(interval=1)).save(1)
    with pytest.raises(CheckpointError, match=r"'extra.thing' cannot be loaded with torch.load\(weights_only=True\)"):
        CheckpointManager(tmp_path, states).load()


def test_checkpoint_files_hold_no_unrecorded_files(saved):
    meta = json.loads((saved / "titan_meta.json").read_text())
    written = {p.name for p in saved.iterdir()} - {"titan_meta.json"}
    assert written == set(meta["files"]), "every file (including .metadata) has a recorded size and CRC-32"
    assert torch.__version__ == meta["torch_version"]


def run_with_two_checkpoints(folder):
    """Checkpoints at steps 2 and 4 of the toy run; returns (the run, its parameters at step 2)."""
    run = toy_run(folder, config=CheckpointConfig(interval=2))
    at_two = None
    for step in range(1, 5):
        run.step()
        run.manager.save(step)
        if step == 2:
            at_two = {k: v.clone() for k, v in run.model.state_dict().items()}
    run.manager.close()
    return run, at_two


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_auto_resume_skips_a_damaged_newest_checkpoint_naming_the_file(tmp_path, damage, caplog):
    _, at_two = run_with_two_checkpoints(tmp_path)
    file = data_file(tmp_path / "step-4")
    if damage == "truncate":
        os.truncate(file, file.stat().st_size - 1)
    else:
        data = bytearray(file.read_bytes())
        data[len(data) // 2] ^= 0xFF
        file.write_bytes(bytes(data))
    fresh = toy_run(tmp_path, seed=7)
    with caplog.at_level("WARNING", logger="titan.checkpoint"):
        assert fresh.manager.load() == 2
    assert f"{tmp_path / 'step-4'} is damaged and will not be loaded: {file}" in caplog.text
    assert fresh.manager.loaded_from == tmp_path / "step-2"
    for name, value in fresh.model.state_dict().items():
        assert torch.equal(value, at_two[name]), name


def test_every_checkpoint_damaged_is_an_error_not_a_fresh_start(tmp_path):
    run_with_two_checkpoints(tmp_path)
    for step in (2, 4):
        os.truncate(data_file(tmp_path / f"step-{step}"), 10)
    with pytest.raises(CheckpointCorruptError, match=r"every checkpoint in .* is damaged .*step 4: .*step 2: "):
        toy_run(tmp_path).manager.load()


def test_an_explicit_load_step_that_is_damaged_stays_an_error(tmp_path):
    run_with_two_checkpoints(tmp_path)
    file = data_file(tmp_path / "step-4")
    os.truncate(file, 10)
    with pytest.raises(CheckpointCorruptError, match=rf"{file} is 10 bytes"):
        toy_run(tmp_path, config=CheckpointConfig(load_step=4)).manager.load()
