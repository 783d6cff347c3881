"""Muon (+ AdamW) on FSDP 2 and TP 2 against the single-process run of the same global batch (CPU/gloo):
muon_parity_driver.py, the reference one process accumulating the data-parallel ranks' micro-batches.
Tolerances: losses rtol 1e-5, parameters after 4 steps rtol 1e-4 / atol 1e-6 (float32; the gradients differ in
reduction order, ~1e-7 relative, which Newton-Schulz's bfloat16 rounding of its input may round apart).
Tried: a Muon that orthogonalized each shard alone fails all three cases, at the losses."""

import functools

import pytest
import torch

from launch_helpers import run_script

MODEL = ["--model.flavor", "tiny", "--training.seq_len", "64", "--training.local_batch_size", "2",
         "--training.steps", "4", "--metrics.log_freq", "1000", "--optimizer.name", "Muon",
         "--lr_scheduler.warmup_steps", "1"]  # fmt: skip
F32 = ["--optimizer.muon_ns_dtype", "float32"]
CASES = [("fsdp2", 2, F32), ("tp2", 1, [*F32, "--parallelism.tensor_parallel_degree", "2"])]


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("muon_parity"))


@functools.cache
def result(tmp_root: str, case_id: str, nproc: int | None, *options: str) -> dict:
    """What the driver saved; `options` go first (`--emulate-dp W` must lead)."""
    out = f"{tmp_root}/{case_id}.pt"
    proc = run_script("muon_parity_driver.py", [out, *options, *MODEL, "--job.dump_folder", f"{tmp_root}/{case_id}"],
                      nproc=nproc, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out)


@pytest.mark.parametrize("case_id, dp, options", CASES, ids=[c[0] for c in CASES])
def test_muon_layout_matches_single_process(case_id, dp, options, tmp_root):
    ref = result(tmp_root, f"reference_dp{dp}", None, "--emulate-dp", str(dp), *F32)
    got = result(tmp_root, case_id, 2, *options)
    torch.testing.assert_close(got["losses"], ref["losses"], rtol=1e-5, atol=0)
    assert got["params"].keys() == ref["params"].keys()
    for name, param in ref["params"].items():
        torch.testing.assert_close(got["params"][name], param, rtol=1e-4, atol=1e-6, msg=name)


def test_bfloat16_newton_schulz_matches_within_its_rounding(tmp_root):
    """torch's bfloat16 iteration, TP 2: a gradient that differs in its last float32 bits rounds to other
    bfloat16 values (unit roundoff u = 2^-8), which five iterations carry into the update. Bound: 4u in each
    parameter's relative difference after 4 steps (measured: at most 8e-3 = 2u, on an attention output)."""
    ref = result(tmp_root, "reference_dp1_bf16", None, "--emulate-dp", "1")
    got = result(tmp_root, "tp2_bf16", 2, "--parallelism.tensor_parallel_degree", "2")
    torch.testing.assert_close(got["losses"], ref["losses"], rtol=1e-5, atol=0)
    for name, param in ref["params"].items():
        error = (got["params"][name] - param).norm() / param.norm()
        assert error <= 4 * 2**-8, f"{name}: relative difference {error:.2e}"
