"""RMSNorm gated by SiLU, the output norm of Qwen3-Next's linear-attention layer: weight * rmsnorm(x) * silu(z),
over each head's d_v channels (one weight shared by all heads)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GatedRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        # Normalize in float32 and round to x's dtype before the weight, in the order transformers' Qwen3-Next
        # uses, so low-precision outputs round as theirs do; the gate's SiLU is taken in float32.
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        normed = self.weight * normed.to(x.dtype)
        return (normed * F.silu(gate.float())).to(x.dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
