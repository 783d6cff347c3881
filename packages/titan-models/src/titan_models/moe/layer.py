"""The mixture-of-experts feed-forward layer: route, dispatch by expert, grouped matmul, combine.

Dropless: every token reaches all of its top-k experts, however uneven the load.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from titan_models.moe.args import MoEArgs
from titan_models.moe.experts import GroupedExperts
from titan_models.moe.local_tensor import local_tensor
from titan_models.moe.router import RoutedTokens, TopKRouter


class MoE(nn.Module):
    """x [bs, seqlen, dim] -> ([bs, seqlen, dim], RoutedTokens): the output and where its tokens went, which
    the model reads for the load-balancing losses and the load statistics (see titan_models.moe.balance)."""

    def __init__(self, dim: int, moe: MoEArgs, shared_expert: nn.Module | None = None):
        super().__init__()
        self.moe = moe
        self.router = TopKRouter(dim, moe)
        self.experts = GroupedExperts(
            dim,
            moe.hidden_dim,
            moe.num_experts,
            bias=moe.expert_proj_bias,
            activation=moe.expert_activation,
            swiglu_alpha=moe.swiglu_alpha,
            swiglu_limit=moe.swiglu_limit,
        )
        self.shared_experts = shared_expert
        # A [1, dim] weight applied by F.linear, not an nn.Linear: no Linear-swapping transform (float8) touches it.
        self.shared_expert_gate = SharedExpertGate(dim) if moe.shared_expert_gate else None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, RoutedTokens]:
        bs, seqlen, dim = x.shape
        tokens = x.reshape(-1, dim)
        routing = self.router(tokens)

        top_k = routing.experts.shape[-1]
        order = routing.experts.reshape(-1).argsort(stable=True)  # (token, choice) pairs grouped by expert
        token_of = order // top_k
        offsets = routing.tokens_per_expert.cumsum(0).to(torch.int32)
        expert_out = self.experts(tokens[token_of], offsets)
        weighted = expert_out * routing.weights.reshape(-1, 1)[order].to(expert_out.dtype)
        out = torch.zeros_like(tokens).index_add_(0, token_of, weighted.to(tokens.dtype))
        if self.shared_experts is not None:
            shared = self.shared_experts(tokens)
            if self.shared_expert_gate is not None:
                shared = self.shared_expert_gate(tokens) * shared
            out = out + shared
        routed = RoutedTokens(routing.experts.reshape(bs, seqlen, top_k), routing.scores, routing.tokens_per_expert)
        return out.reshape(bs, seqlen, dim), routed

    def init_weights(self, init, init_std: float) -> None:
        self.router.reset_parameters(init)
        self.experts.init_weights(init, init_std)
        if self.shared_experts is not None:
            self.shared_experts.init_weights(init, init_std)
        if self.shared_expert_gate is not None:
            init.trunc_normal_(self.shared_expert_gate.weight, std=0.02)


class SharedExpertGate(nn.Module):
    """sigmoid(x w^T) [tokens, 1]: how much of the shared experts' output each token takes (Qwen3-Next's
    shared_expert_gate, weight [1, dim]). Read whole on every rank (`local_tensor` for a replicated DTensor): the
    gate scales each token's shared output, so a rank's partial sum of it stays a partial sum of the gated one."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(F.linear(x, local_tensor(self.weight)))
