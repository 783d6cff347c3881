"""Every parallel layout against the single-process run of the same global batch (CPU/gloo, torchrun).

Reference: one process accumulating the data-parallel ranks' micro-batches (parity_driver --emulate-dp),
from the same seed (the init is per-parameter seeded, so every layout starts from the same weights).
Tolerances: float32 losses rtol 1e-5; gradients after step 1 rtol 1e-4 / atol 1e-6 (reductions run in a
different order); grad norm rtol 1e-4 (a float32 sum over ~10^5 squares).
bfloat16 compute: per-tensor relative tolerances, justified at BF16_REL_TOL.
"""

import functools

import pytest
import torch

from applied_checks import assert_layout_applied
from launch_helpers import parity_result, run_script

MODEL = ["--model.flavor", "tiny", "--training.seq_len", "64", "--training.local_batch_size", "2",
         "--training.steps", "5", "--metrics.log_freq", "1000"]  # fmt: skip
FP32 = dict(loss_rtol=1e-5, grad_rtol=1e-4, grad_atol=1e-6)

ASYNC_TP = ("--parallelism.enable_async_tensor_parallel", "true")
# (id, world size, data-parallel degree, options)
CASES = [
    ("fsdp2", 2, 2, []),
    ("fsdp4_ac_full", 4, 4, ["--activation_checkpoint.mode", "full"]),
    ("hsdp2x2_ac_op", 4, 4, ["--parallelism.data_parallel_replicate_degree", "2",
                             "--activation_checkpoint.mode", "selective",
                             "--activation_checkpoint.selective_ac_option", "op"]),
    ("ddp2_ac_every2", 2, 2, ["--parallelism.data_parallel_replicate_degree", "2",
                              "--parallelism.data_parallel_shard_degree", "1",
                              "--activation_checkpoint.mode", "selective",
                              "--activation_checkpoint.selective_ac_option", "2"]),
    ("tp2", 2, 1, ["--parallelism.tensor_parallel_degree", "2"]),
    ("tp2_no_loss_parallel_ac_full", 2, 1, ["--parallelism.tensor_parallel_degree", "2",
                                            "--parallelism.enable_loss_parallel", "false",
                                            "--activation_checkpoint.mode", "full"]),
    ("fsdp2_tp2_ac_op", 4, 2, ["--parallelism.tensor_parallel_degree", "2",
                               "--activation_checkpoint.mode", "selective"]),
    ("fsdp2_compile_ac_full", 2, 2, ["--compile.enable", "true", "--activation_checkpoint.mode", "full"]),
    ("tp2_compile_ac_op", 2, 1, ["--parallelism.tensor_parallel_degree", "2", "--compile.enable", "true",
                                 "--activation_checkpoint.mode", "selective"]),
    # Context parallel: the cp ranks of a data-parallel rank share its batch, each holding 2 of 2 x cp chunks.
    ("cp2", 2, 1, ["--parallelism.context_parallel_degree", "2"]),
    ("cp4_allgather", 4, 1, ["--parallelism.context_parallel_degree", "4",
                             "--parallelism.context_parallel_variant", "allgather"]),
    ("fsdp2_cp2_ac_op", 4, 2, ["--parallelism.context_parallel_degree", "2",
                               "--activation_checkpoint.mode", "selective"]),
    ("tp2_cp2", 4, 1, ["--parallelism.context_parallel_degree", "2", "--parallelism.tensor_parallel_degree", "2"]),
    # Async TP: Titan's micro-pipelined styles (applied_checks expects AsyncColwise/AsyncRowwiseParallel).
    ("tp2_async", 2, 1, ["--parallelism.tensor_parallel_degree", "2", *ASYNC_TP]),
    ("fsdp2_tp2_async_ac_op", 4, 2, ["--parallelism.tensor_parallel_degree", "2", *ASYNC_TP,
                                     "--activation_checkpoint.mode", "selective"]),
    # Compiled blocks with Titan's async layers between their graphs (the block compiles in pieces).
    ("tp2_async_compile_ac_op", 2, 1, ["--parallelism.tensor_parallel_degree", "2", *ASYNC_TP,
                                       "--compile.enable", "true", "--activation_checkpoint.mode", "selective"]),
    ("tp2_cp2_async_ac_full", 4, 1, ["--parallelism.context_parallel_degree", "2",
                                     "--parallelism.tensor_parallel_degree", "2", *ASYNC_TP,
                                     "--activation_checkpoint.mode", "full"]),
]  # fmt: skip

SIMPLE = ["--parallelism.fsdp_implementation", "simple_fsdp"]
SIMPLE_CASES = [
    ("simple_fsdp2", 2, 2, SIMPLE),
    # Compiled on 2 ranks: every rank compiles the same graphs at once on a cold cache, so 4 cost twice the time.
    ("simple_fsdp2_compile_ac_op", 2, 2, [*SIMPLE, "--compile.enable", "true", "--activation_checkpoint.mode",
                                          "selective"]),
    ("simple_replicate2", 2, 2, [*SIMPLE, "--parallelism.data_parallel_replicate_degree", "2",
                                 "--parallelism.data_parallel_shard_degree", "1"]),
    ("simple_hybrid2x2_ac_full", 4, 4, [*SIMPLE, "--parallelism.data_parallel_replicate_degree", "2",
                                        "--activation_checkpoint.mode", "full"]),
    ("simple_fsdp2_tp2", 4, 2, [*SIMPLE, "--parallelism.tensor_parallel_degree", "2"]),
    ("simple_fsdp2_cp2", 4, 2, [*SIMPLE, "--parallelism.context_parallel_degree", "2"]),
]  # fmt: skip
CASES += SIMPLE_CASES

PP2 = ["--parallelism.pipeline_parallel_degree", "2"]
LOCAL_BATCH_4 = ("--training.local_batch_size", "4")  # 4 micro-batches: DualPipeV needs one per stage
# (id, world size, data-parallel degree, options the reference shares, options); the tiny model has 4 blocks,
# so multi-stage schedules run 2 stages of 1 block on each of 2 pipeline ranks.
PP_CASES = [
    ("pp2_gpipe_explicit_split", 2, 1, LOCAL_BATCH_4,
     [*PP2, "--parallelism.pipeline_parallel_schedule", "GPipe",
      "--parallelism.pipeline_parallel_stage_blocks", "layers.0,layers.1 layers.2 layers.3"]),
    ("pp2_1f1b_ac_full", 2, 1, LOCAL_BATCH_4, [*PP2, "--activation_checkpoint.mode", "full"]),
    ("pp2_interleaved1f1b_accumulation_ac_every2", 2, 1, ("--training.global_batch_size", "4"),
     [*PP2, "--parallelism.pipeline_parallel_schedule", "Interleaved1F1B", "--activation_checkpoint.mode",
      "selective", "--activation_checkpoint.selective_ac_option", "2"]),
    ("pp2_interleaved_zero_bubble", 2, 1, LOCAL_BATCH_4,
     [*PP2, "--parallelism.pipeline_parallel_schedule", "InterleavedZeroBubble"]),
    ("pp2_zbv_ac_full", 2, 1, LOCAL_BATCH_4,
     [*PP2, "--parallelism.pipeline_parallel_schedule", "ZBVZeroBubble", "--activation_checkpoint.mode", "full"]),
    ("pp2_dualpipev", 2, 1, LOCAL_BATCH_4, [*PP2, "--parallelism.pipeline_parallel_schedule", "DualPipeV"]),
    ("pp2_1f1b_compile_layers_per_stage", 2, 1, (),
     [*PP2, "--compile.enable", "true", "--parallelism.pipeline_parallel_layers_per_stage", "3"]),
    ("fsdp2_pp2_interleaved1f1b", 4, 2, (), [*PP2, "--parallelism.pipeline_parallel_schedule", "Interleaved1F1B"]),
    ("tp2_pp2", 4, 1, (), [*PP2, "--parallelism.tensor_parallel_degree", "2"]),
    ("tp2_pp2_async", 4, 1, (), [*PP2, "--parallelism.tensor_parallel_degree", "2", *ASYNC_TP]),
    ("simple_fsdp2_pp2", 4, 2, (), [*PP2, *SIMPLE]),
    ("fsdp2_tp2_pp2", 8, 2, (), [*PP2, "--parallelism.tensor_parallel_degree", "2"]),
    ("pp2_tp2_cp2", 8, 1, (), [*PP2, "--parallelism.tensor_parallel_degree", "2",
                               "--parallelism.context_parallel_degree", "2"]),
]  # fmt: skip

# Degrees above 2, on tiny8 (8 blocks, 4 kv heads): async TP 4, PP 4 with 2 stages per rank and micro-batches of 2;
# and the one 4D layout (16 ranks: slow session). What covers the cases left out: docs/testing.md.
TINY8 = ("--model.flavor", "tiny8")
FLOAT8 = ("--float8.enable", "true", "--float8.emulate", "true")
WIDE_CASES = [
    ("tp4_async", 4, 1, TINY8, ["--parallelism.tensor_parallel_degree", "4", *ASYNC_TP]),
    ("pp4_interleaved1f1b_microbatch2", 4, 1, (*TINY8, "--training.local_batch_size", "8"),
     ["--parallelism.pipeline_parallel_degree", "4", "--parallelism.pipeline_parallel_schedule", "Interleaved1F1B",
      "--parallelism.pipeline_parallel_microbatch_size", "2"]),
    # Float8 (emulated on CPU: the same float8 rounding, matmuls in fp32) against single-process float8.
    ("fsdp2_float8_all_gather", 2, 2, FLOAT8, ["--float8.enable_fsdp_float8_all_gather", "true"]),
    ("tp2_float8", 2, 1, FLOAT8, ["--parallelism.tensor_parallel_degree", "2"]),
    # Float8Linear under async TP: the chunked collectives run its float8 matmuls (whole-tensor scales).
    ("tp2_float8_async", 2, 1, FLOAT8, ["--parallelism.tensor_parallel_degree", "2", *ASYNC_TP]),
    pytest.param("fsdp2_tp2_pp2_cp2", 16, 2, (), [*PP2, "--parallelism.tensor_parallel_degree", "2",
                                                  "--parallelism.context_parallel_degree", "2"],
                 marks=pytest.mark.slow, id="fsdp2_tp2_pp2_cp2"),
]  # fmt: skip


@functools.cache
def reference(dp: int, tmp_root: str, bf16: bool, options: tuple[str, ...] = ()) -> dict:
    out = f"{tmp_root}/reference_dp{dp}_{'bf16' if bf16 else 'fp32'}_{'_'.join(options)}.pt"
    extra = ["--training.mixed_precision_param", "bfloat16"] if bf16 else []
    return parity_result(out, ["--emulate-dp", str(dp), *MODEL, *extra, *options, "--job.dump_folder",
                               f"{tmp_root}/ref"], nproc=None)  # fmt: skip


def assert_parity(result: dict, ref: dict, loss_rtol: float, grad_rtol: float, grad_atol: float) -> None:
    torch.testing.assert_close(result["losses"], ref["losses"], rtol=loss_rtol, atol=0)
    torch.testing.assert_close(result["grad_norms"][0], ref["grad_norms"][0], rtol=max(grad_rtol, 1e-4), atol=0)
    assert result["grads"].keys() == ref["grads"].keys()
    for name, grad in ref["grads"].items():
        torch.testing.assert_close(result["grads"][name], grad, rtol=grad_rtol, atol=grad_atol, msg=name)


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("parity"))


@pytest.mark.parametrize("case_id, world, dp, options", CASES, ids=[c[0] for c in CASES])
def test_layout_matches_single_process(case_id, world, dp, options, tmp_root):
    out = f"{tmp_root}/{case_id}.pt"
    proc = run_script("parity_driver.py", [out, *MODEL, *options, "--job.dump_folder", f"{tmp_root}/{case_id}"],
                      nproc=world)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = torch.load(out)
    assert_layout_applied(result["applied"], world, options)
    assert_parity(result, reference(dp, tmp_root, bf16=False), **FP32)


@pytest.mark.parametrize("case_id, world, dp, shared, options", PP_CASES + WIDE_CASES,
                         ids=[c[0] if isinstance(c, tuple) else c.id for c in PP_CASES + WIDE_CASES])  # fmt: skip
def test_layout_with_its_own_reference_matches_single_process(case_id, world, dp, shared, options, tmp_root):
    """`shared` options (model, batch) go to the reference too. Pipeline stages hold different parameters: the
    driver gathers every stage's gradients."""
    out = f"{tmp_root}/{case_id}.pt"
    proc = run_script("parity_driver.py", [out, *MODEL, *shared, *options, "--job.dump_folder",
                                           f"{tmp_root}/{case_id}"], nproc=world)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = torch.load(out)
    assert_layout_applied(result["applied"], world, [*shared, *options])
    assert_parity(result, reference(dp, tmp_root, False, shared), **FP32)


# bfloat16 parameters (FSDP casts them for compute, gradients reduced in float32 unless said otherwise),
# each against the single-process bf16 run (autocast). Both round every matmul input to bf16 (8 significand
# bits: unit roundoff u = 2^-8 = 3.9e-3) but at different places (FSDP casts norms and residuals too; autocast
# keeps them fp32), and matmuls accumulate in fp32, so a gradient's error is a few roundings of its inputs
# propagated through 4 blocks: a few u per tensor, relative (measured: at most 2.5u, median 1.8u). We allow
# 4u = 1.6e-2 in the relative norm of each gradient's difference (||g - g_ref|| / ||g_ref||), and u in the
# losses (means over 128 tokens; measured 0.1u). A layout bug that drops or doubles one rank's contribution
# moves a gradient by ~50%, 30x past this bound.
BF16_REL_TOL = 4 * 2**-8
BF16 = ["--training.mixed_precision_param", "bfloat16"]
BF16_CASES = [
    ("fsdp2_bf16", BF16),
    ("fsdp2_bf16_reduce_bf16", [*BF16, "--training.mixed_precision_reduce", "bfloat16"]),
    ("fsdp2_bf16_reshard_always", [*BF16, "--parallelism.fsdp_reshard_after_forward", "always"]),
    ("fsdp2_bf16_reshard_never", [*BF16, "--parallelism.fsdp_reshard_after_forward", "never"]),
    ("simple_fsdp2_bf16", [*SIMPLE, *BF16]),
]


def assert_relative_parity(result: dict, ref: dict, rel_tol: float) -> None:
    torch.testing.assert_close(result["losses"], ref["losses"], rtol=2**-8, atol=0)
    assert result["grads"].keys() == ref["grads"].keys()
    for name, grad in ref["grads"].items():
        error = (result["grads"][name] - grad).norm() / grad.norm()
        assert error <= rel_tol, f"{name}: relative error {error:.2e} > {rel_tol:.2e}"


@pytest.mark.parametrize("case_id, options", BF16_CASES, ids=[c[0] for c in BF16_CASES])
def test_bfloat16_layout_matches_single_process_bfloat16(case_id, options, tmp_root):
    out = f"{tmp_root}/{case_id}.pt"
    proc = run_script("parity_driver.py", [out, *MODEL, *options, "--job.dump_folder", f"{tmp_root}/{case_id}"],
                      nproc=2)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = torch.load(out)
    assert_layout_applied(result["applied"], 2, options)
    assert_relative_parity(result, reference(2, tmp_root, bf16=True), BF16_REL_TOL)
    assert result["losses"] != reference(2, tmp_root, bf16=False)["losses"]  # it really ran in bf16


def test_unequal_layout_fails_fast(tmp_root):
    """Launched as users launch it; the other layout errors are unit-tested in titan-train's test_config."""
    options = ["--parallelism.tensor_parallel_degree", "4"]
    proc = run_script("parity_driver.py", [f"{tmp_root}/never.pt", *MODEL, *options], nproc=4, timeout=120)
    assert proc.returncode != 0
    assert "parallelism.tensor_parallel_degree=4 does not divide n_kv_heads=2 (model.flavor='tiny'); use 1 or 2" in (
        proc.stderr
    )
