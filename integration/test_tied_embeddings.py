"""Tied embeddings (Llama 3.2 1B / 3B style, the tiny-3.2 flavor) on parallel layouts, against the
single-process run of the same global batch, as test_parallel_parity does for untied models.

Reference: parity_driver --emulate-dp (same seed, same weights); tolerances those of test_parallel_parity:
losses rtol 1e-5, gradients after step 1 rtol 1e-4 / atol 1e-6, grad norm rtol 1e-4. The tied matrix has
one gradient (the sum of its two uses), reported under tok_embeddings.weight. Under pipeline parallelism the
first and the last stage each hold a copy, their gradients summed once per step (the driver refuses copies that
differ; the grad norm counts one).
"""

import functools

import pytest
import torch

from applied_checks import assert_layout_applied
from launch_helpers import run_script

MODEL = ["--model.flavor", "tiny-3.2", "--training.seq_len", "64", "--training.local_batch_size", "2",
         "--training.steps", "3", "--metrics.log_freq", "1000"]  # fmt: skip
TP2 = ["--parallelism.tensor_parallel_degree", "2"]
PP2 = ["--parallelism.pipeline_parallel_degree", "2", "--parallelism.pipeline_parallel_schedule"]
CASES = [
    ("fsdp2", 2, 2, []),
    ("tp2", 2, 1, TP2),
    ("tp2_no_loss_parallel", 2, 1, [*TP2, "--parallelism.enable_loss_parallel", "false"]),
    ("fsdp2_tp2", 4, 2, TP2),
    # The last stage holds a copy of the embedding for its head, the gradients summed with the first stage's:
    # between two ranks (1F1B), and on one (ZBV: rank 0 holds the first and the last stage).
    ("pp2_1f1b", 2, 1, [*PP2, "1F1B"]),
    ("pp2_zbv", 2, 1, [*PP2, "ZBVZeroBubble"]),
]


@functools.cache
def reference(dp: int, tmp_root: str) -> dict:
    out = f"{tmp_root}/reference_dp{dp}.pt"
    proc = run_script("parity_driver.py", [out, "--emulate-dp", str(dp), *MODEL, "--job.dump_folder",
                                           f"{tmp_root}/ref"], nproc=None)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("tied"))


@pytest.mark.parametrize("case_id, world, dp, options", CASES, ids=[c[0] for c in CASES])
def test_tied_model_matches_single_process(case_id, world, dp, options, tmp_root):
    out = f"{tmp_root}/{case_id}.pt"
    proc = run_script("parity_driver.py", [out, *MODEL, *options, "--job.dump_folder", f"{tmp_root}/{case_id}"],
                      nproc=world)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    result, ref = torch.load(out, weights_only=False), reference(dp, tmp_root)
    assert_layout_applied(result["applied"], world, [*MODEL, *options])
    assert "output.weight" not in ref["grads"]  # one parameter: the tie held in the reference
    torch.testing.assert_close(result["losses"], ref["losses"], rtol=1e-5, atol=0)
    torch.testing.assert_close(result["grad_norms"][0], ref["grad_norms"][0], rtol=1e-4, atol=0)
    assert result["grads"].keys() == ref["grads"].keys()  # the tie held on this layout too
    for name, grad in ref["grads"].items():
        torch.testing.assert_close(result["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
