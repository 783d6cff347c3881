"""Failures as production has them, under `torchrun --max-restarts`: a worker killed (-9) between
checkpoints or in the middle of an asynchronous save, a worker that hangs (SIGSTOP), a damaged newest
checkpoint. Every try must complete, and the resumed run must train exactly as the uninterrupted one
(losses and final weights bit for bit: the same layout, deterministic mode)."""

import json
import signal
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from fault_injection import run_with_fault
from launch_helpers import DEBUG_RECIPE, read_metrics, run_titan

STEPS = 12
TIMEOUT_S = 5
TINY = [
    "--config", str(DEBUG_RECIPE), "--model.flavor", "tiny", "--training.seq_len", "32",
    "--training.local_batch_size", "2", "--training.deterministic", "true", "--metrics.log_freq", "1",
    "--training.steps", str(STEPS), "--lr_scheduler.warmup_steps", "2", "--checkpoint.enable", "true",
    "--checkpoint.interval", "4", "--checkpoint.keep_latest_k", "0", "--validation.enable", "false",
    "--lr_scheduler.decay_type", "constant", "--comm.train_timeout_seconds", str(TIMEOUT_S),
]  # fmt: skip


def losses(dump: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(dump)}  # a repeated step keeps its latest row


def final_weights(dump: Path) -> dict[str, torch.Tensor]:
    out = dump.parent / f"{dump.name}.final.pt"
    dcp_to_torch_save(dump / "checkpoint" / f"step-{STEPS}", out)
    return {k: v for k, v in torch.load(out, weights_only=False)["model"].items()}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    dump = tmp_path_factory.mktemp("straight") / "run"
    proc = run_titan([*TINY, "--job.dump_folder", str(dump)], nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dump


def assert_same_training(dump: Path, reference: Path) -> None:
    assert losses(dump) == losses(reference)
    expected = final_weights(reference)
    got = final_weights(dump)
    assert got.keys() == expected.keys()
    for name, value in got.items():
        assert torch.equal(value, expected[name]), name


def kill_and_resume(tmp_path: Path, reference: Path, victim: int, after_step: int, **kwargs) -> str:
    dump = tmp_path / "run"
    outcome = run_with_fault([*TINY, "--job.dump_folder", str(dump)], dump, victim_rank=victim,
                             after_step=after_step, max_restarts=1, **kwargs)  # fmt: skip
    assert outcome.injected, outcome.output[-3000:]
    assert outcome.returncode == 0, outcome.output[-5000:]
    restarts = json.loads((dump / "run.json").read_text())["restart"]
    assert restarts == 1, outcome.output[-5000:]  # the kill really cost an attempt
    assert_same_training(dump, reference)
    return outcome.output


@pytest.mark.parametrize(("victim", "after_step"), [(1, 5), (0, 7)])
def test_kill9_between_checkpoints_resumes_bit_for_bit(tmp_path, uninterrupted, victim, after_step):
    output = kill_and_resume(tmp_path, uninterrupted, victim, after_step)
    assert "resuming run" in output and "from" in output and "step(s) lost" in output, output[-5000:]


@pytest.mark.slow
@pytest.mark.stress
def test_kill9_ten_times_every_try_completes(tmp_path, uninterrupted):
    for attempt in range(10):  # after step 5 to 11: the step-4 checkpoint exists, the kill costs up to 3 steps
        kill_and_resume(tmp_path / str(attempt), uninterrupted, victim=attempt % 2, after_step=5 + attempt % 7)


@pytest.mark.slow
def test_kill9_during_an_async_save_never_loads_the_partial_checkpoint(tmp_path, uninterrupted):
    dump = tmp_path / "run"
    folder = dump / "checkpoint"

    def save_in_flight() -> bool:
        return any(folder.glob("step-*")) and any(folder.glob(".step-*.tmp"))

    args = [*TINY, "--checkpoint.interval", "2", "--checkpoint.async_mode", "async", "--job.dump_folder", str(dump)]
    outcome = run_with_fault(args, dump, victim_rank=1, after_step=2, when=save_in_flight, max_restarts=1)
    assert outcome.injected, "no save was in flight after a complete one"
    assert outcome.returncode == 0, outcome.output[-5000:]
    resumed = [line for line in outcome.output.splitlines() if "resuming run" in line]
    assert resumed and all(".tmp" not in line for line in resumed), outcome.output[-5000:]
    assert_same_training(dump, uninterrupted)


@pytest.mark.slow  # torchrun gives a stopped worker a grace to answer SIGTERM before SIGKILL: 3 s here (30 s its own)
def test_hung_rank_fails_the_group_within_the_timeout_dumps_and_resumes(tmp_path, uninterrupted):
    dump = tmp_path / "run"
    start = time.monotonic()
    outcome = run_with_fault([*TINY, "--job.dump_folder", str(dump)], dump, victim_rank=1, after_step=5,
                             sig=signal.SIGSTOP, max_restarts=1)  # fmt: skip
    assert outcome.injected and outcome.returncode == 0, outcome.output[-5000:]
    failure = [line for line in outcome.output.splitlines() if "communication failure on rank 0" in line]
    assert failure and f"Timed out waiting {TIMEOUT_S * 1000}ms" in failure[0], outcome.output[-5000:]
    assert "ranks [0, 1]" in failure[0]
    assert (dump / "comm_traces" / "rank_0").is_file()
    assert "resuming run" in outcome.output
    assert_same_training(dump, uninterrupted)
    assert time.monotonic() - start < 300


@pytest.mark.slow
def test_damaged_newest_checkpoint_resumes_from_the_previous_one(tmp_path, uninterrupted):
    dump = tmp_path / "run"
    first = run_titan([*TINY, "--job.dump_folder", str(dump), "--training.steps", "8"], nproc=2)
    assert first.returncode == 0, first.stderr[-3000:]
    damaged = next((dump / "checkpoint" / "step-8").glob("*.distcp"))
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    second = run_titan([*TINY, "--job.dump_folder", str(dump)], nproc=2)
    assert second.returncode == 0, second.stderr[-3000:]
    log = second.stdout + second.stderr
    assert f"{damaged} fails its CRC-32 check" in log and "trying the previous complete checkpoint" in log
    assert "loaded step 4" in log
    assert_same_training(dump, uninterrupted)
