"""Resume on a different layout (CPU/gloo, torchrun): a checkpoint written by FSDP 2 loads on FSDP 4,
TP 2, PP 2, FSDP 2 x PP 2, SimpleFSDP 2 and one process; one written by PP 2 (two stages per rank) loads on
one process and on FSDP 2; one written by SimpleFSDP 2 loads on FSDP2 2 and one process. Model and
optimizer state arrive bit-identical (compared as full tensors right after the load, gathered from every
pipeline stage)."""

import pytest
import torch

from launch_helpers import DEBUG_RECIPE, read_metrics, run_script, run_titan

TINY = [
    "--config", str(DEBUG_RECIPE), "--model.flavor", "tiny", "--training.seq_len", "32",
    "--training.local_batch_size", "2", "--metrics.log_freq", "1", "--checkpoint.enable", "true",
]  # fmt: skip


PP2 = ["--parallelism.pipeline_parallel_degree", "2", "--parallelism.pipeline_parallel_schedule", "Interleaved1F1B"]
SIMPLE = ["--parallelism.fsdp_implementation", "simple_fsdp"]


def write_checkpoint(dump, layout: list[str]):
    proc = run_titan([*TINY, *layout, "--job.dump_folder", str(dump), "--training.steps", "3"], nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = run_script("state_dump.py", [str(dump / "saved.pt"), *TINY, *layout, "--job.dump_folder", str(dump)],
                       nproc=2)  # fmt: skip
    assert saved.returncode == 0, saved.stderr[-3000:]
    return dump


@pytest.fixture(scope="module")
def fsdp2_checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("reshard") / "run", [])


@pytest.fixture(scope="module")
def pp2_checkpoint(tmp_path_factory):
    dump = write_checkpoint(tmp_path_factory.mktemp("reshard_pp") / "run", PP2)
    # Every metrics line reports each pipeline rank's peak memory, not only the last stage's.
    rows = read_metrics(dump)
    assert len(rows) == 3 and all(sorted(row["memory_pp"]) == ["0", "1"] for row in rows), rows
    assert all(peak > 0 for row in rows for peak in row["memory_pp"].values()), rows
    return dump


@pytest.fixture(scope="module")
def simple_fsdp2_checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("reshard_simple") / "run", SIMPLE)


@pytest.mark.parametrize(
    "source, nproc, layout",
    [
        ("fsdp2_checkpoint", 4, []),
        ("fsdp2_checkpoint", 2, ["--parallelism.tensor_parallel_degree", "2"]),
        ("fsdp2_checkpoint", None, []),
        ("fsdp2_checkpoint", 2, ["--parallelism.pipeline_parallel_degree", "2"]),
        ("fsdp2_checkpoint", 4, PP2),
        ("pp2_checkpoint", None, []),
        ("pp2_checkpoint", 2, []),
        ("fsdp2_checkpoint", 2, SIMPLE),
        ("simple_fsdp2_checkpoint", 2, []),
        ("simple_fsdp2_checkpoint", None, []),
    ],
    ids=[
        "fsdp4",
        "tp2",
        "one_process",
        "pp2",
        "fsdp2_pp2",
        "pp2_to_one_process",
        "pp2_to_fsdp2",
        "simple_fsdp2",
        "simple_to_fsdp2",
        "simple_to_one_process",
    ],  # fmt: skip
)
def test_checkpoint_loads_on_another_layout(request, source, nproc, layout, tmp_path):
    dump = request.getfixturevalue(source)
    out = tmp_path / "loaded.pt"
    proc = run_script("state_dump.py", [str(out), *TINY, *layout, "--job.dump_folder", str(dump)], nproc=nproc)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved, loaded = torch.load(dump / "saved.pt"), torch.load(out)
    assert loaded["step"] == saved["step"] == 3
    assert loaded["model"].keys() == saved["model"].keys()
    for name, tensor in saved["model"].items():
        torch.testing.assert_close(loaded["model"][name], tensor, rtol=0, atol=0, msg=name)
    for name, tensor in saved["optimizer"].items():
        torch.testing.assert_close(loaded["optimizer"][name], tensor, rtol=0, atol=0, msg=name)


MOE = ["--model.name", "qwen3_moe"]  # tiny: 8 experts in 3 sparse layers
EP2 = ["--parallelism.expert_parallel_degree", "2"]


@pytest.fixture(scope="module")
def moe_ep2_checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("reshard_ep") / "run", [*MOE, *EP2])


@pytest.mark.parametrize(
    "nproc, layout",
    [(4, ["--parallelism.expert_parallel_degree", "4"]), (2, []), (None, [])],
    ids=["ep4", "fsdp2_no_ep", "one_process"],
)
def test_an_expert_parallel_checkpoint_loads_on_another_expert_layout(moe_ep2_checkpoint, nproc, layout, tmp_path):
    """Experts split over 2 ranks by expert load on 4, on none (FSDP only) and on one process."""
    out = tmp_path / "loaded.pt"
    args = [str(out), *TINY, *MOE, *layout, "--job.dump_folder", str(moe_ep2_checkpoint)]
    proc = run_script("state_dump.py", args, nproc=nproc)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved, loaded = torch.load(moe_ep2_checkpoint / "saved.pt"), torch.load(out)
    assert loaded["step"] == saved["step"] == 3
    assert any(".experts.w1" in name for name in saved["model"])
    assert loaded["model"].keys() == saved["model"].keys()
    for name, tensor in saved["model"].items():
        torch.testing.assert_close(loaded["model"][name], tensor, rtol=0, atol=0, msg=name)
    for name, tensor in saved["optimizer"].items():
        torch.testing.assert_close(loaded["optimizer"][name], tensor, rtol=0, atol=0, msg=name)
