"""Context parallelism: the load-balanced split and block attention in one process; ring attention and a
toy transformer under CP (with FSDP, TP, AC) on 2 and 4 gloo ranks, one launch each (cp_script.py)."""

import itertools
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # multiprocess.py beside the tests (importlib mode)

from multiprocess import launch  # noqa: E402

from titan_parallel import apply_cp, load_balanced_positions
from titan_parallel.cp.attention_block import block_backward, block_forward
from titan_parallel.cp.ring_attention import _merge
from titan_parallel.cp.ring_blocks import sub_blocks

SCRIPT = Path(__file__).with_name("cp_script.py")
MODEL_CASES = {
    2: [
        "model_cp2",
        "model_cp2_allgather",
        "model_cp2_fsdp",
        "model_cp2_ac_full",
        "model_cp2_ac_op",
        "model_cp2_compile",
        "model_cp2_documents",
        "model_cp2_documents_ac_compile",
    ],
    4: ["model_cp4", "model_fsdp2_cp2", "model_tp2_cp2_fsdp", "model_tp2_cp2_documents", "pipeline_pp2_cp2"],
}


def case_names(world: int) -> list[str]:
    ring = [
        f"ring_{'causal' if causal else 'full'}_{'gqa' if gqa else 'mha'}_{variant}_{kernel}_{seq_len}"
        for causal, gqa, variant, kernel, seq_len in itertools.product(
            (True, False), (False, True), ("p2p", "allgather"), ("auto", "math"), (16 * world, 48)
        )
    ]
    documents = [
        f"ring_documents_{'causal' if causal else 'full'}_{'gqa' if gqa else 'mha'}_{variant}_48"
        for causal, gqa, variant in itertools.product((True, False), (False, True), ("p2p", "allgather"))
    ]
    windows = [(None, True, False), (5, False, False), (13, True, False), (5, True, True), (200, True, True)]
    window = [
        f"ring_window_{w}_{'sinks' if sinks else 'nosinks'}_{'docs' if docs else 'nodocs'}"
        f"_{'gqa' if gqa else 'mha'}_{variant}_{kernel}_48"
        for (w, sinks, docs), gqa, variant, kernel in itertools.product(
            windows, (False, True), ("p2p", "allgather"), ("auto", "math")
        )
    ]
    return [*ring, *documents, *window, "errors", *MODEL_CASES[world]]


@pytest.fixture(scope="module")
def launches():
    """world size -> output of `torchrun --nproc_per_node world cp_script.py`, run on first use."""
    outputs = {}

    def run(world: int) -> str:
        if world not in outputs:
            outputs[world] = launch(SCRIPT, world)
        return outputs[world]

    return run


@pytest.mark.parametrize("world", [2, 4])
def test_multi_process_cases(launches, world):
    """Reference: full SDPA / the unsharded model, in every case's own tolerance (cp_script.py docstring)."""
    output = launches(world)
    missing = [f"rank {r} {name}" for name in case_names(world) for r in range(world)]
    missing = [line for line in missing if f"{line} ok" not in output]
    assert not missing, f"not ok: {missing[:8]}...\n{output[-6000:]}"


def test_load_balanced_positions_pair_early_and_late_chunks():
    assert load_balanced_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert load_balanced_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert load_balanced_positions(16, 4, 1).tolist() == [2, 3, 12, 13]
    for cp, seq_len in [(2, 48), (4, 48), (4, 64)]:
        shards = [load_balanced_positions(seq_len, cp, r) for r in range(cp)]
        assert sorted(torch.cat(shards).tolist()) == list(range(seq_len))
        # Causal work of a token = keys it attends to = position + 1: equal on every rank.
        assert len({int((s + 1).sum()) for s in shards}) == 1


def test_sequence_not_divisible_by_two_cp_is_refused():
    with pytest.raises(ValueError, match=r"sequence length 50 is not divisible by 2 x context_parallel_degree = 4"):
        load_balanced_positions(50, 2, 0)


@pytest.mark.parametrize("kernel", ["cpu_flash", "math"])
@pytest.mark.parametrize("gqa", [False, True])
def test_blocks_merged_by_lse_equal_sdpa(kernel, gqa):
    """Two key blocks (causal diagonal + full) merged by log-sum-exp, and their backward from the merged values,
    against SDPA on all keys with the matching mask; fp32, atol 1e-5."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 6, 8, generator=g, requires_grad=True)
    k = torch.randn(2, 2 if gqa else 4, 12, 8, generator=g, requires_grad=True)
    v = torch.randn(2, 2 if gqa else 4, 12, 8, generator=g, requires_grad=True)
    mask = torch.ones(6, 12, dtype=torch.bool).tril(6)  # keys 0..5 all seen, 6..11 causally
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    grad_out = torch.randn(expected.shape, generator=g)
    expected.backward(grad_out)

    qd, kd, vd, scale = q.detach(), k.detach(), v.detach(), 8**-0.5
    blocks = [(slice(6, 12), True), (slice(0, 6), False)]
    out = lse = None
    for cols, causal in blocks:
        block_out, block_lse = block_forward(qd, kd[:, :, cols], vd[:, :, cols], causal, scale, kernel)
        if out is None:
            out, lse = block_out.clone(), block_lse.clone()
        else:
            _merge(out, lse, block_out, block_lse)
    torch.testing.assert_close(out, expected.detach(), rtol=0, atol=1e-5)
    dq, dk, dv = torch.zeros_like(qd), torch.zeros_like(kd), torch.zeros_like(vd)
    for cols, causal in blocks:
        dq_b, dk_b, dv_b = block_backward(grad_out, qd, kd[:, :, cols], vd[:, :, cols], out, lse, causal, scale, kernel)
        dq += dq_b
        dk[:, :, cols], dv[:, :, cols] = dk_b, dv_b
    for actual, reference in [(dq, q.grad), (dk, k.grad), (dv, v.grad)]:
        torch.testing.assert_close(actual, reference, rtol=0, atol=1e-5)


def test_torch_implementation_needs_cuda():
    with pytest.raises(ValueError, match="implementation='torch' needs a CUDA DeviceMesh"):
        apply_cp(torch.nn.Module(), None, ["attention"], implementation="torch")


def test_a_sliding_window_is_refused_by_torchs_implementation_naming_the_module():
    model = torch.nn.Module()
    model.attention = torch.nn.Module()
    model.attention.sliding_window = 4
    with pytest.raises(ValueError, match="implementation='torch' needs a CUDA DeviceMesh"):
        apply_cp(model, None, ["attention"], implementation="torch")


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("window", [1, 3, 6, 7, 13, 19, 100])
def test_sub_blocks_cover_exactly_the_visible_pairs_and_no_more_than_the_band(cp, window):
    """Every visible (query, key) pair of a rank is computed exactly once over all blocks; each sub-block holds a
    visible pair; with a window no longer than a chunk, at most 2 window - 1 keys are scored per query (the band):
    sub_blocks against a dense mask."""
    seq_len = 40 * cp
    chunk = seq_len // (2 * cp)
    position = torch.arange(seq_len)
    visible = (position[:, None] >= position[None, :]) & (position[:, None] - position[None, :] < window)
    for rank in range(cp):
        mine = load_balanced_positions(seq_len, cp, rank)
        covered = torch.zeros(seq_len, seq_len, dtype=torch.int)
        scored = 0
        for source in range(cp):
            theirs = load_balanced_positions(seq_len, cp, source)
            for block in sub_blocks(rank, source, cp, True, 2 * chunk, window):
                q_pos, k_pos = mine[block.rows], theirs[block.cols]
                seen = visible[q_pos[:, None], k_pos[None, :]]
                assert seen.any(), f"rank {rank} computes a block of {source} with nothing visible"
                if block.causal:
                    assert block.window_origin is None and len(q_pos) == len(k_pos)
                    seen = seen & torch.ones_like(seen).tril()
                if block.window_origin is None:  # computed without a window mask: the window must hide nothing
                    assert seen.sum() == (len(q_pos) * (len(q_pos) + 1) // 2 if block.causal else seen.numel())
                else:
                    assert block.window_origin == (int(q_pos[0]), int(k_pos[0]))
                covered[q_pos[:, None], k_pos[None, :]] += seen.int()
                scored += seen.numel()
        assert torch.equal(covered[mine].bool(), visible[mine]) and covered.max() <= 1
        if window <= chunk:
            assert scored <= (2 * window - 1) * len(mine), (scored, window, chunk)


def test_masked_block_with_rows_that_see_no_key():
    """A document mask can leave a query row of a block with no key: lse -inf and output 0 there (no NaN), so
    the merge with the block that holds its keys gives SDPA's result; fp32, atol 1e-5."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g) for _ in range(3))
    ids = torch.tensor([[0, 0, 1, 1]])
    mask = (ids[:, :, None] == ids[:, None, :]) & torch.ones(4, 4, dtype=torch.bool).tril()
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
    own, own_lse = block_forward(q, k[:, :, 2:], v[:, :, 2:], False, 8**-0.5, "math", mask=mask[:, :, 2:])
    assert torch.isinf(own_lse[:, :, :2]).all() and (own[:, :, :2] == 0).all()
    early, early_lse = block_forward(q, k[:, :, :2], v[:, :, :2], False, 8**-0.5, "math", mask=mask[:, :, :2])
    _merge(early, early_lse, own, own_lse)
    torch.testing.assert_close(early, expected, rtol=0, atol=1e-5)
