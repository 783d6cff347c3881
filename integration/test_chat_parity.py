"""Chat fine-tuning (training.dataset = "chat": labels only on the assistant's tokens, conversations packed) on FSDP 2
with gradient accumulation (2 ranks x 2 micro-batches of 2 rows) against one process taking the same global batch
of 8 rows as one micro-batch.

The micro-batches hold different numbers of assistant tokens, so a mean of per-micro-batch means would differ from
the one-batch mean; only the loss normalised over the assistant tokens of the whole global batch
(run/loss_weights.py) is the same on both. Tolerances as test_parallel_parity.py's float32 cases: losses rtol 1e-5,
gradients after step 1 rtol 1e-4 / atol 1e-6.
"""

import torch

from launch_helpers import parity_result
from test_parallel_parity import FP32, assert_parity

CHAT = ["--model.flavor", "tiny", "--training.seq_len", "64", "--training.global_batch_size", "8",
        "--training.steps", "3", "--metrics.log_freq", "1000",
        "--training.dataset", "chat", "--training.chat_packing", "pack",
        "--model.attention_mask", "block_causal", "--model.positions", "document"]  # fmt: skip


def test_fsdp2_with_accumulation_matches_one_process(tmp_path):
    one_batch = ["--training.local_batch_size", "8", "--job.dump_folder", f"{tmp_path}/one"]
    ref = parity_result(f"{tmp_path}/one.pt", [*CHAT, *one_batch], nproc=None)
    accumulated = ["--training.local_batch_size", "2", "--job.dump_folder", f"{tmp_path}/fsdp2"]
    result = parity_result(f"{tmp_path}/fsdp2.pt", [*CHAT, *accumulated], nproc=2)
    assert_parity(result, ref, **FP32)
    assert all(torch.isfinite(torch.tensor(result["losses"])))
