"""flops_per_token of Qwen3-Next: a Gated DeltaNet layer counts the chunked gated delta rule's work, by hand and as
the rule's own matmuls and triangular solves add up when it runs."""

import dataclasses

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from titan_models.decoder.flops import count_params, flops_per_token
from titan_models.linear_attention.gated_delta_rule import chunk_gated_delta_rule
from titan_models.qwen3_next import FLAVORS


def test_tiny_flavor_by_hand():
    # tiny: 4 layers (3 Gated DeltaNet, then 1 full attention of 4 heads of width 32); the DeltaNet has 4 value
    # heads, key and value head widths 16, chunks of 64 tokens.
    args = FLAVORS["tiny"]
    seq_len = 512  # 8 chunks
    parameters = 6 * count_params(args, active=True)
    attention = 6 * 4 * (32 + 32) * seq_len  # the one full layer: QK^T and AV over every key, fwd + bwd
    c, d = 64, 16
    per_chunk = (
        2 * c * c * d  # (beta k) k^T
        + 2 * c * c * d  # q k^T
        + c * (c - 1) * d  # solve for the corrections from beta v (C (C - 1) / 2 multiply-adds a column)
        + c * (c - 1) * d  # solve for how the state enters, from beta k
        + 2 * c * d * d  # the corrections read the state
        + 2 * c * d * d  # the outputs read the state
        + 2 * c * c * d  # scores times corrections
        + 2 * c * d * d  # the state update
    )
    delta_rule = 3 * 3 * 4 * per_chunk * 8 // seq_len  # fwd + bwd, 3 layers, 4 value heads, 8 chunks
    assert per_chunk == 620_544 and delta_rule == 349_056  # 9,696 FLOPs a token per head and layer
    assert flops_per_token(args, seq_len) == parameters + attention + delta_rule


class _CountRuleFlops(TorchDispatchMode):
    """2 FLOPs a multiply-add of every batched matmul, and of every unit lower-triangular solve (row r of the C x C
    system reads r earlier rows, for each right-hand-side column)."""

    def __init__(self):
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func._overloadpacket)
        if name in ("aten.bmm", "aten.mm"):
            self.flops += 2 * args[0].numel() * args[1].shape[-1]
        elif name == "aten.linalg_solve_triangular":
            system, rhs = args[0], args[1]
            c = system.shape[-1]
            self.flops += c * (c - 1) // 2 * 2 * rhs.numel() // c
        return func(*args, **kwargs)


def test_matches_the_rule_as_it_runs():
    """The per-layer term equals 3 x the forward FLOPs counted while chunk_gated_delta_rule runs on the tiny
    flavor's shapes (key heads repeated to value heads by the rule itself)."""
    layer = FLAVORS["tiny"].linear_attention
    seq_len = 256
    q, k = (torch.randn(1, seq_len, layer.n_key_heads, layer.key_head_dim) for _ in range(2))
    v = torch.randn(1, seq_len, layer.n_value_heads, layer.value_head_dim)
    g, beta = -torch.rand(1, seq_len, layer.n_value_heads), torch.rand(1, seq_len, layer.n_value_heads)
    with _CountRuleFlops() as counted:
        chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, chunk_size=layer.chunk_size)
    assert counted.flops > 0
    args = FLAVORS["tiny"]
    without = flops_per_token(dataclasses.replace(args, layer_types=["full_attention"] * 4), seq_len)
    attention = 6 * 4 * (32 + 32) * seq_len
    with_linear = flops_per_token(args, seq_len)
    # Three linear layers instead of three full ones: their parameters differ too, so compare the mixing terms.
    parameters_delta = 6 * (count_params(args, active=True) - count_params(
        dataclasses.replace(args, layer_types=["full_attention"] * 4), active=True))  # fmt: skip
    assert with_linear - (without - 3 * attention) - parameters_delta == 3 * 3 * counted.flops // seq_len


def test_80b_a3b_delta_rule_share():
    """At 4096 tokens the published shape's 36 DeltaNet layers add 15.7 MFLOPs a token each (32 heads of 128 x 128)."""
    args = FLAVORS["80B-A3B"]
    per_layer = 3 * 32 * (4 * 64 * 64 * 128 + 64 * 63 * 256 + 2 * 64 * 64 * 128 + 6 * 64 * 128 * 128) // 64
    full = 6 * 16 * (256 + 256) * 4096 * 12
    assert flops_per_token(args, 4096) == 6 * count_params(args, active=True) + full + 36 * per_layer
