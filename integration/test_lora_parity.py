"""LoRA on every layout against the single-process LoRA run of the same global batch (CPU/gloo, torchrun): the
frozen base and the adapters, sharded by FSDP, split by TP like their base layer, cut by PP, compiled. Reference
and tolerances: test_parallel_parity.py's (float32). Only adapters have gradients, so the comparison of every
gradient there is the adapters' here."""

import pytest
import torch

from launch_helpers import run_script
from test_parallel_parity import FP32, MODEL, assert_parity, reference

LORA = ("--lora.enable", "true", "--lora.target_modules", "wq,wk,wv,wo,w1,w2,w3", "--lora.rank", "4",
        "--optimizer.lr", "1e-2")  # fmt: skip
CASES = [
    ("lora_fsdp2", 2, 2, []),
    ("lora_tp2", 2, 1, ["--parallelism.tensor_parallel_degree", "2"]),
    ("lora_pp2", 2, 1, ["--parallelism.pipeline_parallel_degree", "2"]),
    ("lora_fsdp2_compile", 2, 2, ["--compile.enable", "true"]),
]  # fmt: skip


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("lora_parity"))


@pytest.mark.parametrize("case_id, world, dp, options", CASES, ids=[c[0] for c in CASES])
def test_lora_layout_matches_single_process(case_id, world, dp, options, tmp_root):
    out = f"{tmp_root}/{case_id}.pt"
    proc = run_script("parity_driver.py", [out, *MODEL, *LORA, *options, "--job.dump_folder",
                                           f"{tmp_root}/{case_id}"], nproc=world)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = torch.load(out)
    assert result["grads"] and all(".lora_" in name for name in result["grads"])
    assert_parity(result, reference(dp, tmp_root, False, LORA), **FP32)
