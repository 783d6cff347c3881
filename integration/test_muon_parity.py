"""Muon (+ AdamW) on each layout against the single-process run of the same global batch (CPU/gloo):
muon_parity_driver.py, the reference one process accumulating the data-parallel ranks' micro-batches (with
training.global_batch_size, gradient accumulation too). Layouts: FSDP 2, TP 2, HSDP 2x2 with accumulation,
SimpleFSDP 2 compiled, PP 2 (1F1B), CP 2 (FSDP over the cp ranks), DeepSeek-V3 on FSDP 4 with EP 2, Qwen3-MoE
on FSDP 2 x TP 2 (every expert split on its hidden units).
Tolerances: losses rtol 1e-5, parameters after 4 steps rtol 1e-4 / atol 1e-6 (float32 Newton-Schulz; the
gradients differ in reduction order, ~1e-7 relative).
Applied: each sharded Muon matrix's first update, gathered whole (each expert's, in a stack), has its largest
singular value in [0.68, 1.21]. The iteration's p(x) = 3.4445x - 4.775x^3 + 2.0315x^5 maps [0, 1.2025] into
itself (1.2025 its maximum, at x = 0.5545) and carries every singular value that is not tiny into [0.684,
1.2025]; the largest (at least 1/sqrt(rank) of the Frobenius norm the input is divided by) always gets there.
Measured: 1.11 to 1.2023. Shards orthogonalized alone stack into 1.39 to 2.16 (orthonormal halves add up).
Tried: a Muon that orthogonalized each rank's local shard alone (whole_matrix.orthogonalize_whole) fails both
tests on all seven sharded layouts (the parity at the losses); pp2_1f1b (no sharded matrix) and the DeepSeek
expert stacks (split only by expert: whole matrices, orthogonalized in place either way) still pass, as they
should."""

import functools

import pytest
import torch

from launch_helpers import parity_result

MODEL = ["--model.flavor", "tiny", "--training.seq_len", "64", "--training.local_batch_size", "2",
         "--training.steps", "4", "--metrics.log_freq", "1000", "--optimizer.name", "Muon",
         "--lr_scheduler.warmup_steps", "1"]  # fmt: skip
F32 = ("--optimizer.muon_ns_dtype", "float32")
TP2 = ["--parallelism.tensor_parallel_degree", "2"]
EP2 = ["--parallelism.expert_parallel_degree", "2"]
QWEN3_MOE = ("--model.name", "qwen3_moe")
DEEPSEEK = ("--model.name", "deepseek_v3")
# (id, world size, data-parallel degree, options the reference shares, options, sharded: check the updates)
CASES = [
    ("fsdp2", 2, 2, (), [], True),
    ("tp2", 2, 1, (), TP2, True),
    ("hsdp2x2_accumulation", 4, 4, ("--training.global_batch_size", "16"),
     ["--parallelism.data_parallel_replicate_degree", "2"], True),
    ("simple_fsdp2_compile", 2, 2, (), ["--parallelism.fsdp_implementation", "simple_fsdp",
                                        "--compile.enable", "true"], True),
    ("pp2_1f1b", 2, 1, ("--training.local_batch_size", "4"), ["--parallelism.pipeline_parallel_degree", "2"], False),
    ("cp2", 2, 1, (), ["--parallelism.context_parallel_degree", "2"], True),
    # Experts split by expert over the ep ranks, then by FSDP over the others; attention FSDP-sharded.
    ("deepseek_fsdp4_ep2", 4, 4, DEEPSEEK, EP2, True),
    # Every expert split on its hidden units (TP) and the stack by expert (FSDP): no rank holds a whole matrix.
    ("qwen3_moe_fsdp2_tp2", 4, 2, QWEN3_MOE, TP2, True),
]  # fmt: skip


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("muon_parity"))


@functools.cache
def result(tmp_root: str, case_id: str, nproc: int | None, *options: str) -> dict:
    """What the driver saved; `options` go first (`--emulate-dp W` must lead)."""
    args = [*options, *MODEL, "--job.dump_folder", f"{tmp_root}/{case_id}"]
    return parity_result(f"{tmp_root}/{case_id}.pt", args, nproc, driver="muon_parity_driver.py", timeout=300)


def reference(tmp_root: str, dp: int, shared: tuple[str, ...], *more: str) -> dict:
    case_id = "_".join(["reference", f"dp{dp}", *(o.lstrip("-").replace(".", "_") for o in (*shared, *more))])
    return result(tmp_root, case_id, None, "--emulate-dp", str(dp), *shared, *more)


@pytest.mark.parametrize("case_id, world, dp, shared, options, sharded", CASES, ids=[c[0] for c in CASES])
def test_muon_layout_matches_single_process(case_id, world, dp, shared, options, sharded, tmp_root):
    ref = reference(tmp_root, dp, shared, *F32)
    got = result(tmp_root, case_id, world, *shared, *F32, *options)
    torch.testing.assert_close(got["losses"], ref["losses"], rtol=1e-5, atol=0)
    assert got["params"].keys() == ref["params"].keys()
    for name, param in ref["params"].items():
        torch.testing.assert_close(got["params"][name], param, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("case_id, world, dp, shared, options, sharded", CASES, ids=[c[0] for c in CASES])
def test_sharded_muon_matrices_are_orthogonalized_whole(case_id, world, dp, shared, options, sharded, tmp_root):
    """Each sharded Muon matrix's first update (each expert's, in a stack), gathered: its largest singular value
    lies in the band of Newton-Schulz's output, [0.68, 1.21] (module docstring)."""
    got = result(tmp_root, case_id, world, *shared, *F32, *options)
    assert bool(got["updates"]) == sharded, sorted(got["updates"])
    for name, update in got["updates"].items():
        largest = torch.linalg.matrix_norm(update, ord=2)
        outside = largest[(largest < 0.68) | (largest > 1.21)]
        assert not len(outside), f"{name} ({got['placements'][name]}): largest singular values {largest.tolist()}"


def test_bfloat16_newton_schulz_matches_within_its_rounding(tmp_root):
    """torch's bfloat16 iteration, TP 2: a gradient that differs in its last float32 bits rounds to other
    bfloat16 values (unit roundoff u = 2^-8), which five iterations carry into the update. Bound: 4u in each
    parameter's relative difference after 4 steps (measured: at most 8e-3 = 2u, on an attention output)."""
    ref = reference(tmp_root, 1, ())
    got = result(tmp_root, "tp2_bf16", 2, *TP2)
    torch.testing.assert_close(got["losses"], ref["losses"], rtol=1e-5, atol=0)
    for name, param in ref["params"].items():
        error = (got["params"][name] - param).norm() / param.norm()
        assert error <= 4 * 2**-8, f"{name}: relative difference {error:.2e}"
