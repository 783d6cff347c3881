"""The dry run's attention as a CUDA run computes it: FlexAttention for sinks and windows (no score matrix; the
window's keys only), and windowed ring attention's skipped chunk pairs (simulate/flex_stand_in.py, op_costs.py)."""

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from titan_debug import OpTrace
from titan_models.decoder.attention_kernels import variant_attention
from titan_train.simulate.fake_runtime import fake_rank
from titan_train.simulate.op_costs import OPAQUE_OP_COSTS

B, H, S, D = 2, 4, 64, 16


def _attend(kernel: str) -> tuple[list, torch.Tensor]:
    """Forward and backward of windowed attention with sinks on fake tensors, as the dry run traces them."""
    trace = OpTrace(costs=OPAQUE_OP_COSTS)
    with fake_rank(0, 1):
        q, k, v = (torch.empty(B, H, S, D, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        sinks = torch.empty(H, requires_grad=True)
        with trace:
            out = variant_attention(q, k, v, sinks=sinks, window=8, kernel=kernel)
            out.float().sum().backward()
        return trace.ops, sinks.grad


def test_sinks_and_a_window_run_flex_attention_with_no_score_matrix_and_count_the_windows_keys():
    ops, sinks_grad = _attend("auto")
    names = [op.name for op in ops]
    assert "titan.flex_attention_stand_in.default" in names
    assert "titan.flex_attention_stand_in_backward.default" in names
    assert sinks_grad is not None and sinks_grad.shape == (H,)  # the sinks learn through the log-sum-exp
    scores = B * H * S * S * 4  # one float32 score matrix
    assert max(n for op in ops for _, n in op.writes) < scores
    # Query p sees min(p + 1, 8) keys: 1 + ... + 8 + 56 * 8 = 484 pairs a head; 4 FLOPs a pair and width.
    forward = next(op for op in ops if op.name == "titan.flex_attention_stand_in.default")
    assert forward.flops == 4 * B * H * 484 * D
    backward = next(op for op in ops if op.name == "titan.flex_attention_stand_in_backward.default")
    assert backward.flops == forward.flops * 5 // 2


def test_a_forced_eager_kernel_keeps_its_score_matrix():
    ops, _ = _attend("eager")
    assert not any("flex_attention_stand_in" in op.name for op in ops)
    assert max(n for op in ops for _, n in op.writes) >= B * H * S * S * 4


@pytest.fixture
def ring_of_four():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        yield dist.new_group([0, 1, 2, 3])
    finally:
        dist.destroy_process_group()


def test_windowed_ring_attention_costs_only_the_band_inside_the_window(ring_of_four):
    """CP 4, 64 local queries (two chunks of 32: rank r holds chunks r and 7 - r), window 8: a query chunk computes
    only the band of its own chunk, in tiles of 8 queries (the first against 8 keys, the next three against the 15
    keys from 7 before the tile to its last: 8 x 8 + 3 x 8 x 15 = 424 scores), and of the chunk before it only the
    first tile against that chunk's last 7 keys (8 x 7 = 56); every other pair is skipped. Ranks 1-3: 2 x (424 +
    56) = 960 scores, the busiest; rank 0 (chunk 0 has no predecessor): 904. Without the window: 64 queries over
    256 keys, causal (half)."""
    q = torch.empty(B, H, S, D)
    bound = {"q": q, "k": q, "v": q, "group_name": ring_of_four.group_name, "causal": True, "window": 8}
    flops, ring = OPAQUE_OP_COSTS["titan.ring_attention"](bound)
    assert flops == 4 * B * H * 960 * D
    full, full_ring = OPAQUE_OP_COSTS["titan.ring_attention"]({**bound, "window": None})
    assert full == 4 * B * H * S * (4 * S) * D // 2
    assert ring.nbytes == full_ring.nbytes  # the K/V blocks still travel the whole ring
    backward, _ = OPAQUE_OP_COSTS["titan.ring_attention_backward"](bound)
    assert backward == flops * 5 // 2


def test_a_window_as_long_as_the_sequence_costs_the_causal_half(ring_of_four):
    q = torch.empty(B, H, S, D)
    bound = {"q": q, "k": q, "v": q, "group_name": ring_of_four.group_name, "causal": True}
    full, _ = OPAQUE_OP_COSTS["titan.ring_attention"]({**bound, "window": None})
    # A window of the whole sequence cuts no chunk pair: each runs the fused kernel, the diagonals causal.
    whole, _ = OPAQUE_OP_COSTS["titan.ring_attention"]({**bound, "window": 4 * S})
    assert whole == full


def test_the_stand_in_computes_what_the_eager_kernel_does_outputs_and_gradients():
    """On real tensors the stand-in runs its reference computation: with the sinks' rescaling around it, the same
    function as the eager kernel (Hugging Face's formula), so the dry run traces the ops a CUDA run does."""
    from titan_train.simulate.flex_stand_in import flex_attention_stand_in

    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, 24, D, requires_grad=True) for _ in range(3))
    sinks = torch.randn(H, requires_grad=True)
    results = []
    for attend in (
        lambda: flex_attention_stand_in(q, k, v, None, None, sinks, 5, True, D**-0.5),
        lambda: variant_attention(q, k, v, sinks=sinks, window=5, kernel="eager"),
    ):
        out = attend()
        grads = torch.autograd.grad(out.sin().sum(), (q, k, v, sinks))
        results.append((out, *grads))
    for ours, eager in zip(*results, strict=True):
        torch.testing.assert_close(ours, eager, rtol=1e-5, atol=1e-5)  # both float32 inside
