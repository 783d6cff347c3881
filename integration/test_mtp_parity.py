"""Multi-token prediction (model.mtp_layers) under FSDP/HSDP/DDP against the single-process run of the same global
batch: the main loss, each depth's MTP loss and the gradients after step 1 (the MTP modules' included).

Reference and tolerances as test_parallel_parity: one process accumulating the data ranks' micro-batches;
float32 losses rtol 1e-5 over 5 steps, gradients rtol 1e-4 / atol 1e-6. lambda = 0.5 until step 3, then 0.2, so
a layout that dropped the MTP loss, or its schedule, moves the gradients and the later losses past the tolerance.
The MTP modules' MoE ledger (Decoder.mtp_routing) takes the loss weight of each micro-batch as the main one's
(without, the reference weighs their aux loss twice: the routers' gradients were 50% off) and its biases move
against the load summed over data ranks.
The chunked loss (llama_fsdp2_chunked_loss) computes every head's cross entropy chunk by chunk against the
reference's plain loss. Expert parallelism dispatches the MTP modules' experts too (deepseek_fsdp2_ep2); tensor
parallelism (with loss parallel) splits the MTP modules as it splits the blocks (llama_tp2_loss_parallel,
deepseek_fsdp2_tp2). Context parallelism shifts inputs and labels in the whole sequence before splitting it and
weighs each rank's depth losses by its share of the kept labels (llama_cp2, deepseek_cp2_documents_aux_free: a
load-balanced split, packed documents). Pipeline parallelism puts the MTP modules on the last stage with a copy of
the embedding, whose gradient is summed with the first stage's once per step (titan-parallel's pp/shared_inputs.py):
point to point between two ranks (llama_pp2_1f1b, deepseek_fsdp2_pp2_interleaved; one rank holding both ends of a V
schedule: test_tied_embeddings.py). The driver's merge of every rank's gradients refuses copies that differ, and
the grad norm (which counts the copy once) is compared.
"""

import pytest
import torch

from applied_checks import assert_layout_applied
from launch_helpers import parity_case, single_process_reference

MODEL = ["--training.seq_len", "64", "--training.local_batch_size", "2", "--training.steps", "5",
         "--metrics.log_freq", "1000", "--model.mtp_layers", "2", "--training.mtp_loss_weight", "0.5",
         "--training.mtp_loss_weight_after", "3", "--training.mtp_loss_weight_late", "0.2"]  # fmt: skip
LLAMA = ("--model.name", "llama3", "--model.flavor", "tiny")
# DeepSeek-V3 tiny: the MTP modules' block is an MoE block, like its last; documents packed block-causally.
PP2 = ["--parallelism.pipeline_parallel_degree", "2", "--parallelism.pipeline_parallel_schedule"]
DEEPSEEK = ("--model.name", "deepseek_v3", "--model.flavor", "tiny", "--moe.load_balance", "sequence_aux_loss",
            "--model.attention_mask", "block_causal", "--model.positions", "document")  # fmt: skip
# (id, world size, data-parallel degree, options the reference shares, options)
CASES = [
    ("llama_fsdp2", 2, 2, LLAMA, []),
    ("llama_hsdp2x2_ac_full", 4, 4, LLAMA, ["--parallelism.data_parallel_replicate_degree", "2",
                                            "--activation_checkpoint.mode", "full"]),
    ("llama_fsdp2_compile_ac_op", 2, 2, LLAMA, ["--compile.enable", "true", "--activation_checkpoint.mode",
                                                "selective"]),
    ("llama_ddp2", 2, 2, LLAMA, ["--parallelism.data_parallel_replicate_degree", "2",
                                 "--parallelism.data_parallel_shard_degree", "1"]),
    ("llama_fsdp2_chunked_loss", 2, 2, LLAMA, ["--training.loss_chunk_tokens", "32"]),
    ("llama_tp2_loss_parallel", 2, 1, LLAMA, ["--parallelism.tensor_parallel_degree", "2"]),
    ("deepseek_fsdp2_tp2", 4, 2, DEEPSEEK, ["--parallelism.tensor_parallel_degree", "2"]),
    ("llama_cp2", 2, 1, LLAMA, ["--parallelism.context_parallel_degree", "2"]),
    # aux_loss_free: under CP the auxiliary losses see each rank's part of the sequences (docs/moe.md).
    ("deepseek_cp2_documents_aux_free", 2, 1, (*DEEPSEEK, "--moe.load_balance", "aux_loss_free",
                                               "--moe.bias_update_rate", "0.05"),
     ["--parallelism.context_parallel_degree", "2"]),
    ("deepseek_fsdp2", 2, 2, DEEPSEEK, []),
    ("deepseek_fsdp2_ep2", 2, 2, DEEPSEEK, ["--parallelism.expert_parallel_degree", "2"]),
    ("deepseek_fsdp2_aux_free", 2, 2, (*DEEPSEEK, "--moe.load_balance", "aux_loss_free",
                                       "--moe.bias_update_rate", "0.05"), []),
    # Float8 (emulated on CPU) on the dense linears, the MTP modules' included, against single-process float8.
    ("llama_fsdp2_float8", 2, 2, (*LLAMA, "--float8.enable", "true", "--float8.emulate", "true"), []),
    ("llama_pp2_1f1b", 2, 1, LLAMA, [*PP2, "1F1B"]),
    ("deepseek_fsdp2_pp2_interleaved", 4, 2, DEEPSEEK, [*PP2, "Interleaved1F1B"]),
]  # fmt: skip
FP32 = dict(loss_rtol=1e-5, grad_rtol=1e-4, grad_atol=1e-6)


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("mtp_parity"))


@pytest.mark.parametrize("case_id, world, dp, shared, options", CASES, ids=[c[0] for c in CASES])
def test_mtp_layout_matches_single_process(case_id, world, dp, shared, options, tmp_root):
    result = parity_case(tmp_root, case_id, [*MODEL, *shared, *options], world)
    assert_layout_applied(result["applied"], world, [*MODEL, *shared, *options])
    ref = single_process_reference(tmp_root, dp, (*MODEL, *shared))
    assert [row["mtp_loss_weight"] for row in ref["mtp"]] == [0.5] * 3 + [0.2] * 2
    torch.testing.assert_close(result["losses"], ref["losses"], rtol=FP32["loss_rtol"], atol=0)
    torch.testing.assert_close(result["grad_norms"], ref["grad_norms"], rtol=FP32["grad_rtol"], atol=0)
    for depth in ("mtp_loss_1", "mtp_loss_2"):
        got, want = [row[depth] for row in result["mtp"]], [row[depth] for row in ref["mtp"]]
        torch.testing.assert_close(got, want, rtol=FP32["loss_rtol"], atol=0, msg=depth)
    assert result["grads"].keys() == ref["grads"].keys()
    assert any(name.startswith("mtp.2.eh_proj") for name in ref["grads"])
    # The MTP modules' MoE: weighted like the main loss's (their routers' gradients), biases moved alike.
    assert result["buffers"].keys() == ref["buffers"].keys()
    assert any(name.startswith("mtp.") for name in ref["buffers"]) == ("aux_loss_free" in shared)
    for name, bias in ref["buffers"].items():
        assert bias.abs().sum() > 0, name
        torch.testing.assert_close(result["buffers"][name], bias, rtol=0, atol=1e-6, msg=name)
    for name, grad in ref["grads"].items():
        torch.testing.assert_close(result["grads"][name], grad, rtol=FP32["grad_rtol"], atol=FP32["grad_atol"],
                                   msg=name)  # fmt: skip
