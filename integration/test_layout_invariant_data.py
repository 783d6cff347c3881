"""The layout-invariant data order at the command line: one process with gradient accumulation, FSDP 2 and
FSDP 4 of the same global batch train on the same sequences, and so give the same losses; a run restarted on
fewer ranks (elastic world size: data_parallel_shard_degree = -1, global batch kept, accumulation recomputed)
or resumed on another layout continues as the uninterrupted run.

Tolerance: losses within rtol 1e-5 (fp32). Every layout computes the same global batch's mean loss; only
the order of the float32 sums differs (micro-batch accumulation, all-reduce, sharded or pipelined
compute), a few ulps per step, which AdamW's first steps do not amplify past 1e-5 in this tiny model.
"""

import math

import pytest

from launch_helpers import DEBUG_RECIPE, read_metrics, run_titan

RTOL = 1e-5
TINY = [
    "--config", str(DEBUG_RECIPE),
    "--model.flavor", "tiny",
    "--training.seq_len", "32",
    "--training.local_batch_size", "2",
    "--training.global_batch_size", "8",
    "--training.deterministic", "true",
    "--validation.enable", "false",
    "--metrics.log_freq", "1",
    "--lr_scheduler.warmup_steps", "2",
    "--lr_scheduler.decay_type", "constant",
]  # fmt: skip


def losses(folder) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(folder)}  # a repeated step keeps its last value


def train(folder, nproc, steps, *options) -> dict[int, float]:
    proc = run_titan([*TINY, "--training.steps", str(steps), "--job.dump_folder", str(folder), *options], nproc=nproc)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return losses(folder)


def assert_close(got: dict[int, float], want: dict[int, float]) -> None:
    assert sorted(got) == sorted(want)
    far = {s: (got[s], want[s]) for s in want if not math.isclose(got[s], want[s], rel_tol=RTOL)}
    assert not far, f"losses differ beyond rtol {RTOL}: {far}"


@pytest.fixture(scope="module")
def fsdp4(tmp_path_factory):
    """The uninterrupted 4-rank run, 10 steps."""
    return train(tmp_path_factory.mktemp("fsdp4"), 4, 10)


@pytest.fixture(scope="module")
def fsdp2(tmp_path_factory):
    return train(tmp_path_factory.mktemp("fsdp2"), 2, 10)


def test_one_process_fsdp2_and_fsdp4_train_on_the_same_sequences(tmp_path, fsdp2, fsdp4):
    one = train(tmp_path / "one", None, 10)  # `titan-train`, accumulation 4
    assert_close(fsdp2, one)  # torchrun 2 ranks, accumulation 2
    assert_close(fsdp4, one)  # torchrun 4 ranks, no accumulation


def test_restart_on_fewer_ranks_keeps_the_global_batch(tmp_path, fsdp4):
    ckpt = ["--checkpoint.enable", "true", "--checkpoint.interval", "4"]
    train(tmp_path / "run", 4, 4, *ckpt)  # stops at step 4 (the constant schedule does not depend on it)
    proc = run_titan([*TINY, "--training.steps", "10", "--job.dump_folder", str(tmp_path / "run"), *ckpt], nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loaded step 4" in proc.stdout + proc.stderr
    assert_close(losses(tmp_path / "run"), fsdp4)  # steps 5..10 on 2 ranks with accumulation 2


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout",
    [["--parallelism.tensor_parallel_degree", "2"], ["--parallelism.pipeline_parallel_degree", "2"]],
    ids=["tp2", "pp2"],
)
def test_fsdp2_checkpoint_continues_training_on_another_layout(tmp_path, fsdp2, layout):
    ckpt = ["--checkpoint.enable", "true", "--checkpoint.interval", "4"]
    train(tmp_path / "run", 2, 4, *ckpt)
    proc = run_titan(
        [*TINY, "--training.steps", "10", "--job.dump_folder", str(tmp_path / "run"), *ckpt, *layout], nproc=2
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loaded step 4" in proc.stdout + proc.stderr
    assert_close(losses(tmp_path / "run"), fsdp2)
