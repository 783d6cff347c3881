"""Checkpoints at object-store URLs, with the guarantees of a local folder: exact resume, keep-k, async
saves, a damaged newest checkpoint skipped, a save that never finished never loaded, HF export and import.
Each test runs on fsspec's in-process memory store and on a real S3 server (moto) on the loopback address."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import ckpt_toy
import pytest
import torch
from ckpt_toy import params, toy_run
from fsspec.core import url_to_fs

from titan_checkpoint import (
    CheckpointConfig,
    CheckpointError,
    complete_steps,
    export_safetensors,
    import_hf_checkpoint,
    load_checkpoint,
    read_meta,
)
from titan_checkpoint.cli import main
from titan_checkpoint.storage import FsspecChecksumWriter

KILL_SCRIPT = Path(__file__).with_name("kill_during_save.py")


def files(url):
    """Every object under `url`, relative to it."""
    fs, root = url_to_fs(url)
    fs.invalidate_cache()
    return sorted(path[len(root.rstrip("/")) + 1 :] for path in fs.find(root))


def train_and_save(url, steps, config):
    run = toy_run(url, config=config)
    losses = []
    for step in range(1, steps + 1):
        losses.append(run.step())
        run.manager.save(step, last=step == steps)
    run.manager.close()
    return run, losses


@pytest.mark.parametrize("async_mode", ["disabled", "async"])
def test_resume_from_the_store_continues_exactly(store_url, async_mode):
    first, losses = train_and_save(store_url, 6, CheckpointConfig(interval=3, async_mode=async_mode))
    assert complete_steps(store_url) == [3, 6]
    # The marker is titan_meta.json in step-N; no temporary folder, no per-rank checksum files left.
    saved = files(store_url)
    assert "step-3/titan_meta.json" in saved and "step-3/.metadata" in saved
    assert not [f for f in saved if ".tmp" in f or f.endswith("checksums.json")], saved
    assert read_meta(f"{store_url}/step-6")["files"].keys() == {
        f[len("step-6/") :] for f in saved if "step-6/" in f
    } - {"titan_meta.json"}

    second = toy_run(store_url, seed=1, config=CheckpointConfig(interval=3, load_step=3))
    assert second.manager.load() == 3
    assert [second.step() for _ in range(3)] == losses[3:]
    for name, value in params(second.model).items():
        assert torch.equal(value, params(first.model)[name]), name


def test_keep_latest_k_removes_older_checkpoints_from_the_store(store_url):
    train_and_save(store_url, 5, CheckpointConfig(interval=1, keep_latest_k=2))
    assert complete_steps(store_url) == [4, 5]
    assert {f.split("/")[0] for f in files(store_url)} == {"step-4", "step-5"}


def test_a_save_without_its_marker_never_loads_and_is_cleared_later(store_url):
    train_and_save(store_url, 2, CheckpointConfig(interval=1))
    fs, root = url_to_fs(store_url)
    fs.rm(f"{root}/step-2/titan_meta.json")  # what a save killed before its commit leaves
    assert complete_steps(store_url) == [1]
    resumed = toy_run(store_url, seed=1, config=CheckpointConfig(interval=1))
    assert resumed.manager.load() == 1
    resumed.step()
    resumed.manager.save(2)
    resumed.step()
    resumed.manager.save(3)
    assert complete_steps(store_url) == [1, 2, 3]


def test_saving_a_committed_step_again_uncommits_it_before_writing(store_url, monkeypatch):
    train_and_save(store_url, 2, CheckpointConfig(interval=1))
    resumed = toy_run(store_url, seed=1, config=CheckpointConfig(interval=1, load_step=1))
    assert resumed.manager.load() == 1
    resumed.step()

    def failing_write(self, plan, planner):
        raise OSError("connection reset while uploading")

    monkeypatch.setattr(FsspecChecksumWriter, "write_data", failing_write)
    with pytest.raises(CheckpointError, match="saving step 2"):
        resumed.manager.save(2)
    # The old step 2 was un-committed before any new byte was written: it cannot load half-replaced.
    assert complete_steps(store_url) == [1]


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(store_url, caplog):
    train_and_save(store_url, 2, CheckpointConfig(interval=1))
    fs, root = url_to_fs(store_url)
    data = next(f for f in fs.find(f"{root}/step-2") if f.endswith(".distcp"))
    fs.pipe_file(data, fs.cat_file(data)[:-8])  # truncated
    resumed = toy_run(store_url, seed=1, config=CheckpointConfig(interval=1))
    assert resumed.manager.load() == 1
    assert f"{store_url}/step-2 is damaged" in caplog.text and "is 8 bytes" not in caplog.text


def test_hf_export_to_the_store_and_import_from_it(store_url, tmp_path, toy_adapter_registered):
    run, _ = train_and_save(f"{store_url}/ckpt", 2, CheckpointConfig(interval=2))
    local = export_safetensors(f"{store_url}/ckpt", tmp_path / "hf", dtype="float32")
    remote = export_safetensors(f"{store_url}/ckpt", f"{store_url}/hf", dtype="float32")
    assert remote == f"{store_url}/hf"
    fs, root = url_to_fs(remote)
    assert files(remote) == sorted(p.name for p in local.iterdir())
    for file in local.iterdir():  # the same bytes as the local export
        assert fs.cat_file(f"{root}/{file.name}") == file.read_bytes(), file.name
    with pytest.raises(CheckpointError, match="exists and is not empty"):
        export_safetensors(f"{store_url}/ckpt", remote, dtype="float32")

    imported = import_hf_checkpoint(remote, f"{store_url}/imported")
    assert imported == f"{store_url}/imported/step-0"
    fresh = ckpt_toy.ToyLM(ckpt_toy.ToyArgs())
    assert load_checkpoint(f"{store_url}/imported", {"model": ckpt_toy.ModelState(fresh)}) == 0
    # ... and as a new run's initial weights, straight from the store's HF folder.
    new_run = toy_run(tmp_path / "new", seed=9, config=CheckpointConfig(initial_load_path=remote))
    assert new_run.manager.load() == 0
    for model in (fresh, new_run.model):
        for name, value in params(model).items():
            assert torch.equal(value, params(run.model)[name]), name


def test_an_unsupported_scheme_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match=r"ftp:// scheme is not supported \(supported: s3://, memory://, file://"):
        toy_run("ftp://example/run")
    assert not any(tmp_path.iterdir())


def test_a_missing_bucket_is_an_error_before_the_first_step(s3_endpoint):
    with pytest.raises(CheckpointError, match=r"checkpoint.folder='s3://no-such-bucket/run': cannot write there"):
        toy_run("s3://no-such-bucket/run")


def test_an_unreachable_endpoint_is_an_error_naming_the_url(s3_endpoint, monkeypatch):
    from forked_ranks import free_port

    port = free_port()  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(CheckpointError, match=r"s3://any-bucket/run': cannot write there .*AWS_ENDPOINT_URL"):
        toy_run("s3://any-bucket/run")


@pytest.mark.parametrize(
    ("stage", "signal_line"),
    [("data", "WRITING"), ("commit", "COMMITTING")],
    ids=["halfway_through_a_data_file", "before_the_marker"],
)
def test_kill_9_during_a_save_leaves_the_previous_checkpoint(store_url, tmp_path, stage, signal_line):
    if not store_url.startswith("s3://"):
        pytest.skip("memory:// lives in one process: a killed process takes it along")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(KILL_SCRIPT), store_url, stage], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        line = proc.stdout.readline()  # blocks until the save of step 2 stalls where `stage` says
        assert line.strip() == signal_line, f"script ended early: {line!r} (exit code {proc.poll()})"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert "step-2/titan_meta.json" not in files(store_url)
    if stage == "commit":  # every file of step 2 is there but its marker
        assert "step-2/.metadata" in files(store_url)
    assert complete_steps(store_url) == [1]
    resumed = toy_run(store_url, seed=1, config=CheckpointConfig(interval=1))
    assert resumed.manager.load() == 1
    reference = toy_run(tmp_path / "reference")
    reference.step()
    for name, value in params(resumed.model).items():
        assert torch.equal(value, params(reference.model)[name]), name
    resumed.step()
    resumed.manager.save(2)  # replaces what the killed save left
    assert complete_steps(store_url) == [1, 2]


def test_kill_9_in_the_middle_of_a_multipart_upload_leaves_the_previous_checkpoint(store_url, tmp_path):
    """A data file larger than the upload's part size: the save is killed with parts uploaded and the multipart
    upload never completed. Nothing of step 2 is visible; step 1 loads bit-exact; step 2 is saved again."""
    if not store_url.startswith("s3://"):
        pytest.skip("multipart uploads are S3's; memory:// lives in one process")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(KILL_SCRIPT), store_url, "multipart"], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        line = proc.stdout.readline()
        assert line.strip() == "WRITING", f"script ended early: {line!r} (exit code {proc.poll()})"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    bucket = store_url.removeprefix("s3://").split("/")[0]
    in_flight = multipart_uploads(bucket)
    assert in_flight and all("step-2/" in key for key in in_flight), in_flight  # killed mid-upload, as meant
    assert not [name for name in files(store_url) if name.startswith("step-2/") and name.endswith(".distcp")]
    assert complete_steps(store_url) == [1]
    args = ckpt_toy.ToyArgs(dim=512)  # kill_during_save.py's MULTIPART_ARGS
    resumed = toy_run(store_url, seed=1, config=CheckpointConfig(interval=1), args=args)
    assert resumed.manager.load() == 1
    reference = toy_run(tmp_path / "reference", args=args)
    reference.step()
    for name, value in params(resumed.model).items():
        assert torch.equal(value, params(reference.model)[name]), name
    resumed.step()
    resumed.manager.save(2)
    assert complete_steps(store_url) == [1, 2]


def multipart_uploads(bucket: str) -> list[str]:
    """The keys of the bucket's multipart uploads begun and never completed (nor aborted)."""
    import boto3

    uploads = boto3.client("s3").list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    return [upload["Key"] for upload in uploads]


def test_cli_lists_and_verifies_a_checkpoint_in_the_store(store_url, capsys):
    train_and_save(store_url, 2, CheckpointConfig(interval=1))
    assert main(["list", store_url]) == 0
    listing = capsys.readouterr().out
    assert listing.count("step-") == 2 and "step-2" in listing
    assert main(["verify", store_url]) == 0
    assert f"{store_url}/step-2: ok (sizes and CRC-32s)" in capsys.readouterr().out
    assert main(["list", f"{store_url}-nothing-here"]) == 2
