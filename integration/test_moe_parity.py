"""Qwen3-MoE (tiny: layer 0 dense, 3 sparse layers of 8 experts, 2 per token) on each layout against the
single-process run of the same global batch, with each balancing choice where it applies exactly.

Reference and tolerances as test_parallel_parity: one process accumulating the data ranks' micro-batches;
float32 losses rtol 1e-5 over 5 steps, gradients after step 1 rtol 1e-4 / atol 1e-6, and the
auxiliary-loss-free selection biases after step 5 atol 1e-6 (sums of +-bias_update_rate). The auxiliary loss
weighs 0.1 (not Qwen3's 0.001) so a layout that lost it would move the router gradients well past the
tolerance.

Each balancing choice is exact where its loss is additive over what a layout splits: the HF-style aux_loss is a
mean over micro-batches (data ranks, accumulation) but pools the layers (not pipeline stages: refused there);
the sequence loss is a sum over layers (pipeline stages); under context parallelism every loss would see half
sequences, so CP is checked with aux_loss_free, whose counts add up over any split.
"""

import pytest
import torch

from applied_checks import assert_expert_all_to_all, assert_layout_applied
from launch_helpers import parity_case, run_script, single_process_reference

MODEL = ["--model.name", "qwen3_moe", "--model.flavor", "tiny", "--training.seq_len", "64",
         "--training.local_batch_size", "2", "--training.steps", "5", "--metrics.log_freq", "1000",
         "--moe.aux_loss_coef", "0.1"]  # fmt: skip
SEQUENCE_AUX = ("--moe.load_balance", "sequence_aux_loss")
AUX_FREE = ("--moe.load_balance", "aux_loss_free", "--moe.bias_update_rate", "0.05")
PP2 = ["--parallelism.pipeline_parallel_degree", "2"]
EP2 = ["--parallelism.expert_parallel_degree", "2"]
TP2 = ["--parallelism.tensor_parallel_degree", "2"]
DEEPSEEK = ("--model.name", "deepseek_v3")
GPT_OSS = ("--model.name", "gpt_oss")
QWEN3_NEXT = ("--model.name", "qwen3_next")
CP2 = ["--parallelism.context_parallel_degree", "2"]
# (id, world size, data-parallel degree, options the reference shares, options)
CASES = [
    ("fsdp2", 2, 2, (), []),
    ("fsdp2_accumulation_aux_free", 2, 2, (*AUX_FREE, "--training.global_batch_size", "8"), []),
    ("cp2_aux_free", 2, 1, AUX_FREE, ["--parallelism.context_parallel_degree", "2"]),
    ("pp2_1f1b_sequence_aux_ac_full", 2, 1, (*SEQUENCE_AUX, "--training.local_batch_size", "4"),
     [*PP2, "--activation_checkpoint.mode", "full"]),
    # Expert parallel: the experts split over EP ranks, their rows moved by all-to-all.
    ("ep2", 2, 2, (), [*EP2]),
    ("hsdp2x2_ep2", 4, 4, SEQUENCE_AUX, [*EP2, "--parallelism.data_parallel_replicate_degree", "2"]),
    ("cp2_ep2_aux_free", 2, 1, AUX_FREE, [*EP2, "--parallelism.context_parallel_degree", "2"]),
    ("pp2_ep2_sequence_aux", 4, 2, (*SEQUENCE_AUX, "--training.local_batch_size", "4"), [*PP2, *EP2]),
    # Tensor parallel: every expert on each rank's slice of the hidden units, the router replicated.
    ("fsdp2_tp2_aux_free_ac_op", 4, 2, AUX_FREE, [*TP2, "--activation_checkpoint.mode", "selective"]),
    ("simple_fsdp2_tp2", 4, 2, (), [*TP2, "--parallelism.fsdp_implementation", "simple_fsdp"]),
    ("pp2_tp2_sequence_aux", 4, 1, (*SEQUENCE_AUX, "--training.local_batch_size", "4"), [*PP2, *TP2]),
    # Both (ETP = 1): attention tensor-parallel, experts split over the tp ranks with the data ranks.
    ("tp2_ep2", 2, 1, (), [*TP2, *EP2]),
    ("fsdp2_tp2_ep2_aux_free", 4, 2, AUX_FREE, [*TP2, *EP2]),
    ("fsdp2_tp2_ep4_sequence_aux_ac_op", 4, 2, SEQUENCE_AUX, [*TP2, "--parallelism.expert_parallel_degree", "4",
                                                              "--activation_checkpoint.mode", "selective"]),
    # DeepSeek-V3 (tiny: MLA with a query latent, YaRN, 8 experts in 4 groups, a shared expert, layer 0 dense).
    ("deepseek_fsdp2_aux_free", 2, 2, (*DEEPSEEK, *AUX_FREE), []),
    ("deepseek_cp2_aux_free", 2, 1, (*DEEPSEEK, *AUX_FREE), ["--parallelism.context_parallel_degree", "2"]),
    ("deepseek_pp2_sequence_aux", 2, 1, (*DEEPSEEK, *SEQUENCE_AUX, "--training.local_batch_size", "4"), [*PP2]),
    ("deepseek_fsdp4_ep2_aux_free_ac_full", 4, 4, (*DEEPSEEK, *AUX_FREE),
     [*EP2, "--activation_checkpoint.mode", "full"]),
    ("deepseek_ep2_compile_ac_op", 2, 2, (*DEEPSEEK, *SEQUENCE_AUX), [*EP2, "--compile.enable", "true",
                                                                     "--activation_checkpoint.mode", "selective"]),
    ("deepseek_tp2_aux_free", 2, 1, (*DEEPSEEK, *AUX_FREE), [*TP2]),
    # GPT-OSS (tiny: sinks, an 8-token window on layers 0 and 2, biased attention, router and experts, the clamped
    # SwiGLU, YaRN). Under CP the window cuts the 16-token chunks (cp 2) and 8-token ones (cp 4): ring blocks are
    # skipped, masked and fused; the sinks' gradients are summed over the cp ranks.
    ("gpt_oss_fsdp2_ac_op", 2, 2, GPT_OSS, ["--activation_checkpoint.mode", "selective"]),
    ("gpt_oss_ep2_ac_full", 2, 2, GPT_OSS, [*EP2, "--activation_checkpoint.mode", "full"]),
    ("gpt_oss_pp2_sequence_aux", 2, 1, (*GPT_OSS, *SEQUENCE_AUX, "--training.local_batch_size", "4"), [*PP2]),
    ("gpt_oss_fsdp2_float8", 2, 2, (*GPT_OSS, "--float8.enable", "true", "--float8.emulate", "true"), []),
    ("gpt_oss_cp2_block_causal_aux_free", 2, 1, (*GPT_OSS, *AUX_FREE, "--model.attention_mask", "block_causal"),
     [*CP2]),
    ("gpt_oss_cp2_compile_aux_free", 2, 1, (*GPT_OSS, *AUX_FREE), [*CP2, "--compile.enable", "true"]),
    ("gpt_oss_cp4_aux_free", 4, 1, (*GPT_OSS, *AUX_FREE), ["--parallelism.context_parallel_degree", "4"]),
    # Tensor parallel: the sinks split by head, the router's bias replicated, w1/w3 biases split on hidden and w2's
    # added once, after the reduction (added on every rank, the losses from step 2 on move past the tolerance).
    ("gpt_oss_tp2", 2, 1, GPT_OSS, [*TP2]),
    ("gpt_oss_tp2_ep4_cp2_aux_free", 4, 1, (*GPT_OSS, *AUX_FREE), [*TP2, *CP2,
                                                                 "--parallelism.expert_parallel_degree", "4"]),
    # Qwen3-Next (tiny: three Gated DeltaNet layers then a gated full-attention one, 8 experts, 2 per token, a gated
    # shared expert).
    ("qwen3_next_fsdp2", 2, 2, QWEN3_NEXT, []),
    ("qwen3_next_ep2_ac_full", 2, 2, QWEN3_NEXT, [*EP2, "--activation_checkpoint.mode", "full"]),
    ("qwen3_next_pp2_sequence_aux", 2, 1, (*QWEN3_NEXT, *SEQUENCE_AUX, "--training.local_batch_size", "4"), [*PP2]),
    # Compiled on one rank: the compile is what this case checks, and two ranks compile the same graphs twice.
    ("qwen3_next_compile_ac_op_block_causal", 1, 1, (*QWEN3_NEXT, "--model.attention_mask", "block_causal"),
     ["--compile.enable", "true", "--activation_checkpoint.mode", "selective"]),
    # Tensor parallel: in_proj_qkvz / in_proj_ba by key-head group, the convolution's q | k | v blocks each by head,
    # A_log and dt_bias by value head, the shared expert's gate replicated with its gradient summed. Context
    # parallel: the Gated DeltaNet layers' chunk states combined over the ranks, the full-attention layer's ring.
    ("qwen3_next_tp2", 2, 1, QWEN3_NEXT, [*TP2]),
    ("qwen3_next_cp2_block_causal_aux_free", 2, 1, (*QWEN3_NEXT, *AUX_FREE, "--model.attention_mask", "block_causal"),
     [*CP2]),
    ("qwen3_next_fsdp2_tp2_cp2_aux_free", 8, 2, (*QWEN3_NEXT, *AUX_FREE), [*TP2, *CP2]),
]  # fmt: skip
FP32 = dict(loss_rtol=1e-5, grad_rtol=1e-4, grad_atol=1e-6)


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("moe_parity"))


@pytest.mark.parametrize("case_id, world, dp, shared, options", CASES, ids=[c[0] for c in CASES])
def test_moe_layout_matches_single_process(case_id, world, dp, shared, options, tmp_root):
    result = parity_case(tmp_root, case_id, [*MODEL, *shared, *options], world)
    assert_layout_applied(result["applied"], world, [*shared, *options])
    assert_expert_all_to_all(result["collectives"], options)
    ref = single_process_reference(tmp_root, dp, (*MODEL, *shared))
    torch.testing.assert_close(result["losses"], ref["losses"], rtol=FP32["loss_rtol"], atol=0)
    assert result["grads"].keys() == ref["grads"].keys()
    assert any(".experts.w1" in name for name in ref["grads"])
    # The biases move only with aux_loss_free (the losses hardly show them: a tiny model's experts are alike).
    assert result["buffers"].keys() == ref["buffers"].keys()
    assert bool(ref["buffers"]) == ("aux_loss_free" in shared)
    for name, bias in ref["buffers"].items():
        assert bias.abs().sum() > 0, name
        torch.testing.assert_close(result["buffers"][name], bias, rtol=0, atol=1e-6, msg=name)
    for name, grad in ref["grads"].items():
        torch.testing.assert_close(result["grads"][name], grad, rtol=FP32["grad_rtol"], atol=FP32["grad_atol"],
                                   msg=name)  # fmt: skip


def test_pipeline_refuses_the_pooled_aux_loss_before_starting(tmp_root):
    proc = run_script("parity_driver.py", [f"{tmp_root}/never.pt", *MODEL, *PP2, "--moe.load_balance", "aux_loss"],
                      nproc=2, timeout=120)  # fmt: skip
    assert proc.returncode != 0
    assert "moe.load_balance='aux_loss' pools every MoE layer" in proc.stderr
    assert "'sequence_aux_loss'" in proc.stderr
