"""The Hyena family under the parallel layouts that need no attention, against the single-process run of the
same global batch (CPU/gloo, torchrun); the reference and tolerances (FP32) are test_parallel_parity.py's.

Reference: parity_driver --emulate-dp, one process accumulating the data-parallel ranks' micro-batches, from
the same seed. float32 losses rtol 1e-5; gradients after step 1 rtol 1e-4 / atol 1e-6; grad norm rtol 1e-4.
"""

import functools

import pytest
import torch

from applied_checks import assert_layout_applied
from launch_helpers import run_script
from test_parallel_parity import FP32, assert_parity

MODEL = ["--model.name", "hyena", "--model.flavor", "tiny", "--training.seq_len", "64",
         "--training.local_batch_size", "2", "--training.steps", "5", "--metrics.log_freq", "1000"]  # fmt: skip

# (id, world size, data-parallel degree, options)
CASES = [
    ("fsdp2", 2, 2, []),
    ("ddp2", 2, 2, ["--parallelism.data_parallel_replicate_degree", "2",
                    "--parallelism.data_parallel_shard_degree", "1"]),
    ("tp2_ac_full", 2, 1, ["--parallelism.tensor_parallel_degree", "2", "--activation_checkpoint.mode", "full"]),
    ("fsdp2_tp2_ac_op", 4, 2, ["--parallelism.tensor_parallel_degree", "2",
                               "--activation_checkpoint.mode", "selective"]),
]  # fmt: skip


@functools.cache
def reference(dp: int, tmp_root: str) -> dict:
    out = f"{tmp_root}/reference_dp{dp}.pt"
    args = [out, "--emulate-dp", str(dp), *MODEL, "--job.dump_folder", f"{tmp_root}/ref"]
    proc = run_script("parity_driver.py", args, nproc=None)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out)


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("hyena_parity"))


@pytest.mark.parametrize("case_id, world, dp, options", CASES, ids=[c[0] for c in CASES])
def test_hyena_layout_matches_single_process(case_id, world, dp, options, tmp_root):
    out = f"{tmp_root}/{case_id}.pt"
    proc = run_script("parity_driver.py", [out, *MODEL, *options, "--job.dump_folder", f"{tmp_root}/{case_id}"],
                      nproc=world)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = torch.load(out)
    assert_layout_applied(result["applied"], world, [*MODEL, *options])
    assert_parity(result, reference(dp, tmp_root), **FP32)
