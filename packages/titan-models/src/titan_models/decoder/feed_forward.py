"""The decoder's feed-forward layers: the SwiGLU MLP, and a mixture of experts' shared experts."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from titan_models.moe.local_tensor import local_tensor
from titan_models.seeded_init import SeededInit


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self, init: SeededInit, init_std: float) -> None:
        init.trunc_normal_(self.w1.weight, std=0.02)
        for linear in (self.w2, self.w3):
            init.trunc_normal_(linear.weight, std=init_std)


class SharedExperts(FeedForward):
    """A mixture-of-experts layer's shared experts: the SwiGLU every token goes through, computed from this
    rank's part of each weight (`local_tensor`), as the routed experts are, so a parallel style can split its
    hidden units inside the layer (titan_parallel's MoETensorParallel) with no module hooks of its own. The
    same tensors and names as FeedForward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = (local_tensor(linear.weight) for linear in (self.w1, self.w2, self.w3))
        return F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2)
