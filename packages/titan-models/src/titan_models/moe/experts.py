"""Routed SwiGLU experts as 3-D weights, computed with a grouped matmul (no per-expert modules)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from titan_models.moe.grouped_mm import grouped_mm
from titan_models.moe.local_tensor import local_tensor


class GroupedExperts(nn.Module):
    """num_experts SwiGLU MLPs: out_e(x) = (silu(x w1[e]) * (x w3[e])) w2[e].

    w1 / w3 are [num_experts, dim, hidden], w2 [num_experts, hidden, dim]: each expert's matrices in the
    (in, out) order a grouped matmul reads, so no transpose is taken per step. Hugging Face stores each
    expert's gate_proj / up_proj / down_proj as [out, in] Linear weights; the adapters transpose.
    """

    def __init__(self, dim: int, hidden_dim: int, num_experts: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(num_experts, dim, hidden_dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))
        self.w3 = nn.Parameter(torch.empty(num_experts, dim, hidden_dim))

    def forward(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """x [rows, dim] sorted by expert; offsets [num_experts] int32 end of each expert's rows."""
        w1, w2, w3 = (local_tensor(w) for w in (self.w1, self.w2, self.w3))
        hidden = F.silu(grouped_mm(x, w1, offsets)) * grouped_mm(x, w3, offsets)
        return grouped_mm(hidden, w2, offsets)

    def init_weights(self, init, init_std: float) -> None:
        init.trunc_normal_(self.w1, std=0.02)
        for weight in (self.w2, self.w3):
            init.trunc_normal_(weight, std=init_std)
