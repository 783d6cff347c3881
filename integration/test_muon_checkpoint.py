"""Muon's state through a checkpoint (CPU/gloo), as AdamW's is tested (test_checkpoint_reshard.py; the resume
on FSDP 2, bit for bit, is test_checkpoint_resume.py's `muon` case): an MoE model's checkpoint written on
FSDP 2 x TP 2 loads on one process and on EP 2 with every momentum buffer (and AdamW moment) whole and
bit-identical to the saved one, and the next two steps' losses match the saving run's (rtol 1e-5: another layout
sums in another order; Newton-Schulz in float32, as test_muon_parity.py, so that difference is not rounded up to
bfloat16's)."""

import shutil

import pytest
import torch

from launch_helpers import DEBUG_RECIPE, read_metrics, run_script, run_titan

MUON = ["--optimizer.name", "Muon", "--optimizer.muon_ns_dtype", "float32"]
TINY = [
    "--config", str(DEBUG_RECIPE), "--model.flavor", "tiny", "--training.seq_len", "32",
    "--training.local_batch_size", "2", "--training.deterministic", "true", "--metrics.log_freq", "1",
    "--lr_scheduler.warmup_steps", "2", "--lr_scheduler.decay_type", "constant", "--validation.enable", "false",
    *MUON,
]  # fmt: skip


def losses(folder) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(folder)}  # a repeated step keeps its last value


# Tiny: 8 experts in its sparse layers. The same global batch on every layout (one process accumulates 2).
MOE = ["--model.name", "qwen3_moe", "--checkpoint.enable", "true", "--training.global_batch_size", "4"]
FSDP2_TP2 = ["--parallelism.tensor_parallel_degree", "2"]  # on 4 ranks: data_parallel_shard_degree -1 = 2
SAVED_STEP, STEPS = 3, 5


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory):
    """A Muon run of the MoE model on FSDP 2 x TP 2, checkpointed at step 3 and run on to step 5; the full states
    right after loading step 3 on that layout (saved.pt)."""
    dump = tmp_path_factory.mktemp("muon_reshard") / "run"
    args = [*TINY, *MOE, *FSDP2_TP2, "--job.dump_folder", str(dump)]
    proc = run_titan([*args, "--training.steps", str(STEPS), "--checkpoint.interval", str(SAVED_STEP)], nproc=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    states = run_script("state_dump.py", [str(dump / "saved.pt"), *args, "--checkpoint.load_step", str(SAVED_STEP)],
                        nproc=4)  # fmt: skip
    assert states.returncode == 0, states.stderr[-3000:]
    return dump


@pytest.mark.parametrize("nproc, layout", [(None, []), (2, ["--parallelism.expert_parallel_degree", "2"])],
                         ids=["one_process", "ep2"])  # fmt: skip
def test_muon_state_of_an_fsdp2_tp2_checkpoint_loads_on_another_layout(moe_checkpoint, nproc, layout, tmp_path):
    dump = tmp_path / "run"  # a copy of the step-3 checkpoint alone: the run on from it writes its own
    shutil.copytree(moe_checkpoint / "checkpoint" / f"step-{SAVED_STEP}", dump / "checkpoint" / f"step-{SAVED_STEP}")
    args = [*TINY, *MOE, *layout, "--job.dump_folder", str(dump), "--training.steps", str(STEPS)]
    proc = run_script("state_dump.py", [str(tmp_path / "loaded.pt"), *args], nproc=nproc)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved, loaded = torch.load(moe_checkpoint / "saved.pt"), torch.load(tmp_path / "loaded.pt")
    assert loaded["step"] == saved["step"] == SAVED_STEP
    momentum = [name for name in saved["optimizer"] if name.endswith(".momentum_buffer")]
    assert any(".experts.w1." in name for name in momentum) and any(".attention.wq." in name for name in momentum)
    assert loaded["optimizer"].keys() == saved["optimizer"].keys()
    for name, tensor in saved["optimizer"].items():
        torch.testing.assert_close(loaded["optimizer"][name], tensor, rtol=0, atol=0, msg=name)
    for name, tensor in saved["model"].items():
        torch.testing.assert_close(loaded["model"][name], tensor, rtol=0, atol=0, msg=name)
    # Steps 4 and 5 on this layout: step 5's loss follows a Muon step from the loaded momentum.
    resumed = run_titan(args, nproc=nproc)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"loaded step {SAVED_STEP}" in resumed.stdout + resumed.stderr
    got, want = losses(dump), losses(moe_checkpoint)
    assert sorted(got) == [4, 5], got
    torch.testing.assert_close([got[4], got[5]], [want[4], want[5]], rtol=1e-5, atol=0)
