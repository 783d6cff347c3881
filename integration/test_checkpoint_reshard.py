"""Resume on a different layout (CPU/gloo, torchrun): a checkpoint written by FSDP 2 loads on FSDP 4,
TP 2 and one process. Model and optimizer state arrive bit-identical (compared as full tensors right after
the load), and training goes on from the saved step."""

import pytest
import torch

from launch_helpers import DEBUG_RECIPE, run_script, run_titan

TINY = [
    "--config", str(DEBUG_RECIPE), "--model.flavor", "tiny", "--training.seq_len", "32",
    "--training.local_batch_size", "2", "--metrics.log_freq", "1", "--checkpoint.enable", "true",
]  # fmt: skip


@pytest.fixture(scope="module")
def fsdp2_checkpoint(tmp_path_factory):
    dump = tmp_path_factory.mktemp("reshard") / "run"
    proc = run_titan([*TINY, "--job.dump_folder", str(dump), "--training.steps", "3"], nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = run_script("state_dump.py", [str(dump / "saved.pt"), *TINY, "--job.dump_folder", str(dump)], nproc=2)
    assert saved.returncode == 0, saved.stderr[-3000:]
    return dump


@pytest.mark.parametrize(
    "nproc, layout",
    [(4, []), (2, ["--parallelism.tensor_parallel_degree", "2"]), (None, [])],
    ids=["fsdp4", "tp2", "one_process"],
)
def test_fsdp2_checkpoint_loads_on_another_layout(fsdp2_checkpoint, nproc, layout, tmp_path):
    dump = fsdp2_checkpoint
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
