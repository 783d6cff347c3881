"""Checkpoint resume as users run it (torchrun, CPU/gloo): exact on the same layout (AdamW's state and Muon's),
and a run killed (-9) in the middle of an asynchronous save restarts from the last complete checkpoint."""

import os
import signal
import subprocess
import sys
import time

import pytest

from launch_helpers import DEBUG_RECIPE, ROOT, _env, read_metrics, run_titan

TINY = [
    "--config",
    str(DEBUG_RECIPE),
    "--model.flavor",
    "tiny",
    "--training.seq_len",
    "32",
    "--training.local_batch_size",
    "2",
    "--training.deterministic",
    "true",
    "--metrics.log_freq",
    "1",
    "--training.steps",
    "8",
    "--lr_scheduler.warmup_steps",
    "2",
    "--lr_scheduler.decay_type",
    "constant",
]


def losses(folder) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(folder)}  # a repeated step keeps its last value


# Muon's momentum buffers (Newton-Schulz in float32, as the Muon parity cases) resume as AdamW's moments do.
MUON = ["--optimizer.name", "Muon", "--optimizer.muon_ns_dtype", "float32"]


@pytest.mark.parametrize("optimizer", [[], MUON], ids=["adamw", "muon"])
def test_fsdp2_resume_is_bit_identical(tmp_path, optimizer):
    straight = run_titan([*TINY, *optimizer, "--job.dump_folder", str(tmp_path / "straight")], nproc=2)
    assert straight.returncode == 0, straight.stderr[-3000:]
    ckpt = [
        *TINY,
        *optimizer,
        "--job.dump_folder",
        str(tmp_path / "resumed"),
        "--checkpoint.enable",
        "true",
        "--checkpoint.interval",
        "4",
    ]
    # A run that stops at step 4 (the constant schedule does not depend on the total), then the rest.
    first = run_titan([*ckpt, "--training.steps", "4"], nproc=2)
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_titan(ckpt, nproc=2)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "loaded step 4" in second.stdout + second.stderr
    assert losses(tmp_path / "resumed") == losses(tmp_path / "straight")


def test_kill_during_async_save_resumes_from_the_last_complete_checkpoint(tmp_path):
    dump = tmp_path / "run"
    folder = dump / "checkpoint"
    args = [
        "--config",
        str(DEBUG_RECIPE),
        "--job.dump_folder",
        str(dump),
        "--training.steps",
        "200",
        "--training.local_batch_size",
        "2",
        "--training.seq_len",
        "64",
        "--checkpoint.enable",
        "true",
        "--checkpoint.interval",
        "2",
        "--checkpoint.async_mode",
        "async",
        "--checkpoint.keep_latest_k",
        "0",
    ]
    cmd = [sys.executable, "-m", "titan_train", *args]
    proc = subprocess.Popen(cmd, env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    killed_mid_save = False
    deadline = time.monotonic() + 300
    try:
        # Kill once a checkpoint is complete and the next one is being written.
        while time.monotonic() < deadline and proc.poll() is None:
            complete = [p for p in folder.glob("step-*")] if folder.exists() else []
            writing = list(folder.glob(".step-*.tmp")) if folder.exists() else []
            if complete and writing:
                os.killpg(proc.pid, signal.SIGKILL)
                killed_mid_save = True
                break
            time.sleep(0.005)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert killed_mid_save, "the run never had a save in flight after a complete one"
    steps = sorted(int(p.name.split("-")[1]) for p in folder.glob("step-*"))
    restart = run_titan([*args, "--training.steps", str(steps[-1] + 2)], nproc=1)
    assert restart.returncode == 0, restart.stderr[-3000:]
    assert f"loaded step {steps[-1]}" in restart.stdout + restart.stderr
