"""The dry run of Qwen3-Next: the chunked gated delta rule traced on fake tensors -- its [B, H, n_chunks, C, C]
transients allocated, its matmuls and triangular solves costed (simulate/solve_costs.py) -- and the family's
expert- and pipeline-parallel layouts building and simulating."""

import json
import pathlib

import torch

from titan_debug import AllocationTracker, OpTrace
from titan_models.decoder.flops import flops_per_token
from titan_models.decoder.mixer_flops import delta_rule_forward_flops_per_chunk
from titan_models.linear_attention.args import GatedDeltaNetArgs
from titan_models.linear_attention.gated_delta_rule import chunk_gated_delta_rule
from titan_models.qwen3_next import FLAVORS
from titan_train.cli import train as cli
from titan_train.simulate.fake_runtime import fake_rank
from titan_train.simulate.op_costs import OPAQUE_OP_COSTS

ROOT = pathlib.Path(__file__).resolve().parents[3]
B, S = 2, 256  # 4 chunks of 64
LAYER = GatedDeltaNetArgs(dim=64, n_key_heads=2, n_value_heads=4, key_head_dim=16, value_head_dim=32)


def _trace_rule():
    """Forward and backward of the chunked rule on fake tensors, as the dry run traces a linear-attention layer."""
    tracker = AllocationTracker()
    trace = OpTrace(tracker, costs=OPAQUE_OP_COSTS)
    with fake_rank(0, 1):
        q, k = (torch.empty(B, S, LAYER.n_key_heads, LAYER.key_head_dim, requires_grad=True) for _ in range(2))
        v = torch.empty(B, S, LAYER.n_value_heads, LAYER.value_head_dim, requires_grad=True)
        g, beta = (torch.empty(B, S, LAYER.n_value_heads, requires_grad=True) for _ in range(2))
        with tracker, trace:
            with tracker.phase("forward"):
                out, _ = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, chunk_size=LAYER.chunk_size)
            with tracker.phase("backward"):
                out.sum().backward()
    return trace.ops, tracker


def test_the_rules_forward_is_costed_as_flops_per_token_counts_it():
    ops, _ = _trace_rule()
    forward = [op for op in ops if op.phase == "forward"]
    solves = [op for op in forward if "linalg_solve_triangular" in op.name]
    assert len(solves) == 2 and all(op.flops > 0 for op in solves)
    # Every value head, every chunk: the model's count of the rule, from the traced matmuls and solves.
    assert sum(op.flops for op in forward) == B * LAYER.n_value_heads * 4 * delta_rule_forward_flops_per_chunk(LAYER)
    backward_solves = [op for op in ops if op.phase == "backward" and "linalg_solve_triangular" in op.name]
    assert backward_solves and all(op.flops > 0 for op in backward_solves)


def test_the_chunk_transients_are_allocated():
    """The [B, H, n_chunks, C, C] float32 system, pair decays and scores, and the [B, H, d_k, d_v] float32 states
    of the chunk loop, are real allocations of the trace (what the memory model replays)."""
    _, tracker = _trace_rule()
    sizes = [event.nbytes for event in tracker.events if event.action == "alloc" and event.phase == "forward"]
    chunk_square = B * LAYER.n_value_heads * 4 * 64 * 64 * 4
    state = B * LAYER.n_value_heads * LAYER.key_head_dim * LAYER.value_head_dim * 4
    assert sizes.count(chunk_square) >= 3  # pair decay, system, scores
    assert sizes.count(state) >= 4  # one state per chunk


def _dry_run(tmp_path, *args: str) -> dict:
    assert cli.main(["--dry-run", "--job.dump_folder", str(tmp_path), *args]) == 0
    return json.loads((tmp_path / "dry_run.json").read_text())


def test_the_debug_recipe_simulates_with_expert_and_pipeline_parallel(tmp_path):
    """configs/qwen3_next_debug.toml on 4 ranks, PP 2 x EP 2: both stage classes simulate, the MFU numerator is
    flops_per_token's (the delta rule included) and the step time's compute counts the solves."""
    seq_len, batch = 128, 2
    report = _dry_run(tmp_path, "--config", str(ROOT / "configs/qwen3_next_debug.toml"), "--world-size", "4",
                      "--parallelism.pipeline_parallel_degree", "2", "--parallelism.expert_parallel_degree", "2",
                      "--moe.load_balance", "sequence_aux_loss",  # the pooled loss cannot split over stages
                      "--training.seq_len", str(seq_len), "--training.local_batch_size", str(batch))  # fmt: skip
    assert len(report["rank_classes"]) == 2 and report["experts"]["experts_per_rank"] == 4
    per_token = flops_per_token(FLAVORS["debug"], seq_len)
    for entry in report["rank_classes"]:
        assert entry["peak_reserved_gib"] > entry["params_gib"] > 0
        assert entry["flops_per_step"] == per_token * batch * seq_len * 2 // 4  # 2 data-parallel ranks of 4
