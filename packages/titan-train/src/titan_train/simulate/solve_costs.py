"""FLOPs of the triangular solve, which op_trace counts as memory-bound (its table has matmuls and attention only)
but Qwen3-Next's chunked gated delta rule runs twice a layer on [B, H, n_chunks, C, C] systems, and its backward
twice more (titan_models/linear_attention/gated_delta_rule.py): without them the step-time model would time its
WY transform at the bytes it moves."""

from __future__ import annotations

import math

import torch


def triangular_solve_flops(bound: dict) -> int:
    """aten.linalg_solve_triangular(A [*, n, n], B, left, unitriangular): forward substitution reads, for each
    right-hand-side column, row r's r earlier unknowns -- n (n - 1) / 2 multiply-adds, 2 FLOPs each -- plus n
    divisions when the diagonal is not ones: n - 1 (or n) FLOPs per element of the result."""
    system, rhs = bound["self"], bound["B"]
    n = system.shape[-1]
    columns = rhs.shape[-1] if bound.get("left", True) else rhs.shape[-2]
    batch = math.prod(torch.broadcast_shapes(system.shape[:-2], rhs.shape[:-2]))
    return batch * n * columns * (n - 1 if bound.get("unitriangular", False) else n)


def triangular_solve_cost(bound: dict) -> tuple[int, None]:
    """OpTrace's cost of the solve: its FLOPs, no communication (timed at the matmul rate of its dtype)."""
    return triangular_solve_flops(bound), None
