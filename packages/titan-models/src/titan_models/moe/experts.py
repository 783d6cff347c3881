"""Routed SwiGLU experts as 3-D weights, computed with a grouped matmul (no per-expert modules)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from titan_models.moe.grouped_mm import grouped_mm
from titan_models.moe.local_tensor import local_tensor


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """GPT-OSS's gated unit (HF GptOssExperts._apply_gate, same operations in the same order)."""
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def expert_of_row(offsets: torch.Tensor, rows: int) -> torch.Tensor:
    """[rows] the expert of each expert-sorted row: the first e with offsets[e] > row (no host sync)."""
    return torch.searchsorted(offsets, torch.arange(rows, device=offsets.device, dtype=offsets.dtype), right=True)


class GroupedExperts(nn.Module):
    """num_experts SwiGLU MLPs: out_e(x) = (silu(x w1[e]) * (x w3[e])) w2[e].

    w1 / w3 are [num_experts, dim, hidden], w2 [num_experts, hidden, dim]: each expert's matrices in the
    (in, out) order a grouped matmul reads, so no transpose is taken per step. Hugging Face stores each
    expert's gate_proj / up_proj / down_proj as [out, in] Linear weights; the adapters transpose.

    With `bias` (GPT-OSS) each projection adds its expert's bias to that expert's rows: w1_bias / w3_bias
    [num_experts, hidden], w2_bias [num_experts, dim], stacked per expert on dim 0 like the weights (so expert
    parallelism shards them alike). `activation="clamped_swiglu"` swaps the gated unit for GPT-OSS's.

    Hugging Face's GptOssExperts (transformers 5.x) keeps gate and up interleaved in one (in, out) tensor,
    gate_up_proj [num_experts, dim, 2 * hidden] (gate the even columns, up the odd ones), so importing takes
    no transpose but a de-interleave:
        w1 = gate_up_proj[..., ::2]            w3 = gate_up_proj[..., 1::2]            w2 = down_proj
        w1_bias = gate_up_proj_bias[:, ::2]    w3_bias = gate_up_proj_bias[:, 1::2]    w2_bias = down_proj_bias
    and exporting interleaves back: gate_up_proj = torch.stack((w1, w3), -1).flatten(-2), likewise the biases.
    """

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        num_experts: int,
        bias: bool = False,
        activation: str = "swiglu",
        swiglu_alpha: float = 1.702,
        swiglu_limit: float = 7.0,
    ):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(num_experts, dim, hidden_dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))
        self.w3 = nn.Parameter(torch.empty(num_experts, dim, hidden_dim))
        self.w1_bias = nn.Parameter(torch.empty(num_experts, hidden_dim)) if bias else None
        self.w2_bias = nn.Parameter(torch.empty(num_experts, dim)) if bias else None
        self.w3_bias = nn.Parameter(torch.empty(num_experts, hidden_dim)) if bias else None
        self.activation = activation
        self.swiglu_alpha, self.swiglu_limit = swiglu_alpha, swiglu_limit

    def forward(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """x [rows, dim] sorted by expert; offsets [num_experts] int32 end of each expert's rows."""
        w1, w2, w3 = (local_tensor(w) for w in (self.w1, self.w2, self.w3))
        gate, up = grouped_mm(x, w1, offsets), grouped_mm(x, w3, offsets)
        if self.w1_bias is not None:
            expert = expert_of_row(offsets, x.shape[0])
            gate = gate + local_tensor(self.w1_bias)[expert]
            up = up + local_tensor(self.w3_bias)[expert]
        if self.activation == "clamped_swiglu":
            hidden = clamped_swiglu(gate, up, self.swiglu_alpha, self.swiglu_limit)
        else:
            hidden = F.silu(gate) * up
        out = grouped_mm(hidden, w2, offsets)
        return out if self.w2_bias is None else out + local_tensor(self.w2_bias)[expert]

    def init_weights(self, init, init_std: float) -> None:
        init.trunc_normal_(self.w1, std=0.02)
        for weight in (self.w2, self.w3):
            init.trunc_normal_(weight, std=init_std)
        for bias in (self.w1_bias, self.w2_bias, self.w3_bias):
            if bias is not None:
                nn.init.zeros_(bias)  # as Hugging Face initialises GPT-OSS's expert biases
