"""MuonClip (optimizer.muon_clip_threshold) on sharded layouts against the single-process run of the same global
batch (CPU/gloo): muon_clip_driver.py, the reference one process accumulating the data-parallel ranks' micro-batches.
The threshold is half the first step's largest logit of a run that never clips (threshold 1e9), so every step
clips. Tolerances as test_muon_parity.py's: losses and the step's largest logits rtol 1e-5, parameters after 4
steps rtol 1e-4 / atol 1e-6 (float32 Newton-Schulz). FSDP cuts wq's rows (and MLA's wkv_b) across ranks, tensor
parallelism its heads: each rank must rescale its own rows with the gamma of the head they
belong to, decided on the maxima of all ranks.
Tried: with the rescale switched off the clipped reference equals the unclipped run, which the last assertion
refuses; with the trainer's guard around torch's metadata inference switched off, llama3_pp2 fails on the largest
logits (the made-up inputs' count; what they hold is chance, so the interleaved case passed). That the guard also
covers the inference after each validation is counted in titan-parallel's test_pipeline (metadata_guard cases).
With the ring's keys_for_max_logit switched off (each rank's queries against its own keys only), the three eager
CP cases fail."""

import functools

import pytest
import torch

from launch_helpers import parity_result

MODEL = ["--model.flavor", "tiny", "--training.seq_len", "64", "--training.local_batch_size", "2",
         "--training.steps", "4", "--metrics.log_freq", "1000", "--optimizer.name", "Muon",
         "--optimizer.muon_ns_dtype", "float32", "--lr_scheduler.warmup_steps", "1"]  # fmt: skip
TP2 = ["--parallelism.tensor_parallel_degree", "2"]
PP2 = ["--parallelism.pipeline_parallel_degree", "2"]
CP2 = ["--parallelism.context_parallel_degree", "2"]
PP_BATCH = ("--training.local_batch_size", "4")  # 4 micro-batches of 1
VALIDATE_EVERY_STEP = ("--validation.enable", "true", "--validation.freq", "1", "--validation.steps", "1")
# (id, model, world size, data-parallel degree, options the reference shares, options)
CASES = [
    ("llama3_fsdp2", "llama3", 2, 2, (), []),
    ("llama3_simple_fsdp2", "llama3", 2, 2, (), ["--parallelism.fsdp_implementation", "simple_fsdp"]),
    ("llama3_tp2", "llama3", 2, 1, (), TP2),
    ("qwen3_tp2", "qwen3", 2, 1, (), TP2),  # q/k norms: the layer's smallest gamma over both ranks' heads
    ("llama3_fsdp2_tp2", "llama3", 4, 2, (), TP2),  # 2-D: rows split by FSDP within each rank's TP heads
    ("deepseek_v3_fsdp2", "deepseek_v3", 2, 2, (), []),  # MLA: wq's and wkv_b's rows
    # Each stage's rank records its own layers; torch's runs of the stages on made-up inputs (before the first
    # step, and after each validation) record nothing.
    ("llama3_pp2", "llama3", 2, 1, PP_BATCH, PP2),
    ("llama3_pp2_interleaved_validation", "llama3", 2, 1, (*PP_BATCH, *VALIDATE_EVERY_STEP),
     [*PP2, "--parallelism.pipeline_parallel_schedule", "Interleaved1F1B"]),
    # Each rank's queries against every rank's keys (Titan's ring gathers them), in their global positions.
    ("llama3_cp2_block_causal", "llama3", 2, 1, ("--model.attention_mask", "block_causal"), CP2),
    ("deepseek_v3_cp2", "deepseek_v3", 2, 1, (), CP2),  # MLA
    # Compiled blocks (fullgraph): the gather of the keys is one opaque op.
    ("llama3_cp2_compile", "llama3", 2, 1, (), [*CP2, "--compile.enable", "true", "--compile.backend", "aot_eager"]),
    # A sliding window on every other layer, sinks; aux-loss-free balancing: the batch aux loss is each rank's own
    # tokens' under CP (test_moe_parity.py's CP cases balance so too).
    ("gpt_oss_cp2", "gpt_oss", 2, 1, ("--moe.load_balance", "aux_loss_free"), CP2),
]  # fmt: skip


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("muon_clip"))


@functools.cache
def result(tmp_root: str, case_id: str, nproc: int | None, *options: str) -> dict:
    """What the driver saved; `options` go first (`--emulate-dp W` must lead)."""
    args = [*options, *MODEL, "--job.dump_folder", f"{tmp_root}/{case_id}"]
    return parity_result(f"{tmp_root}/{case_id}.pt", args, nproc, driver="muon_clip_driver.py", timeout=300)


def reference(tmp_root: str, dp: int, threshold: str, *options: str) -> dict:
    case_id = "_".join(["reference", f"dp{dp}", threshold, *(o.lstrip("-").replace(".", "_") for o in options)])
    return result(tmp_root, case_id, None, "--emulate-dp", str(dp), *options, "--optimizer.muon_clip_threshold",
                  threshold)  # fmt: skip


@pytest.mark.parametrize("case_id, model, world, dp, shared, options", CASES, ids=[c[0] for c in CASES])
def test_clipped_layout_matches_single_process(case_id, model, world, dp, shared, options, tmp_root):
    shared = ("--model.name", model, *shared)
    unclipped = reference(tmp_root, dp, "1e9", *shared)
    tau = str(unclipped["max_logits"][0]["max_logit"] / 2)
    ref = reference(tmp_root, dp, tau, *shared)
    got = result(tmp_root, case_id, world, *shared, *options, "--optimizer.muon_clip_threshold", tau)
    torch.testing.assert_close(got["losses"], ref["losses"], rtol=1e-5, atol=0)
    assert got["max_logits"][0].keys() == ref["max_logits"][0].keys()
    for mine, theirs in zip(got["max_logits"], ref["max_logits"], strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=0)
    assert got["params"].keys() == ref["params"].keys()
    for name, param in ref["params"].items():
        torch.testing.assert_close(got["params"][name], param, rtol=1e-4, atol=1e-6, msg=name)
    # The clip did something: the first step's logits were twice tau, and the reference's weights moved away from
    # the unclipped run's.
    assert ref["max_logits"][0]["max_logit"] > 1.5 * float(tau)
    moved = [name for name, param in ref["params"].items() if not torch.allclose(param, unclipped["params"][name])]
    assert any(".attention." in name for name in moved), moved
