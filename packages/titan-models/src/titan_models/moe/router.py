"""Top-k token routing: scores in fp32, a per-expert selection bias for auxiliary-loss-free balancing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from titan_models.moe.args import MoEArgs
from titan_models.moe.local_tensor import local_tensor


@dataclass
class Routing:
    """Where one forward sent its tokens ([tokens] = bs * seqlen, in order)."""

    experts: torch.Tensor
    """[tokens, top_k] chosen expert ids."""
    weights: torch.Tensor
    """[tokens, top_k] the weights their outputs are summed with (fp32)."""
    scores: torch.Tensor
    """[tokens, num_experts] every expert's score (fp32, differentiable): what the auxiliary losses read."""
    tokens_per_expert: torch.Tensor
    """[num_experts] int64 count of (token, expert) assignments."""


class RoutedTokens(NamedTuple):
    """What a sparse block hands back beside its output, for the load-balancing losses and the load counts: a
    plain tuple of tensors, so it passes through activation checkpointing, torch.compile and FSDP hooks as an
    output (a module attribute written inside a compiled, checkpointed block would be an unsafe side effect)."""

    experts: torch.Tensor
    """[bs, seqlen, top_k] chosen expert ids."""
    scores: torch.Tensor
    """[bs * seqlen, num_experts] every expert's score (fp32, differentiable)."""
    tokens_per_expert: torch.Tensor
    """[num_experts] int64 count of (token, expert) assignments."""


class RouterGate(nn.Module):
    """The router's weight [num_experts, dim] and optional bias [num_experts] (GPT-OSS), applied in fp32 by
    TopKRouter. Not an nn.Linear, so no transform that swaps Linear layers (float8) touches the routing
    decision."""

    def __init__(self, dim: int, num_experts: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, dim))
        self.bias = nn.Parameter(torch.empty(num_experts)) if bias else None


class TopKRouter(nn.Module):
    """Linear scores over experts (`gate.weight` [num_experts, dim] in Hugging Face), the top-k of them.

    With load_balance = "aux_loss_free", `expert_bias` (a checkpointed buffer) is added to the scores to
    choose the experts but not to weight them (DeepSeek-V3, "Auxiliary-Loss-Free Load Balancing").
    """

    def __init__(self, dim: int, moe: MoEArgs):
        super().__init__()
        self.moe = moe
        self.gate = RouterGate(dim, moe.num_experts, bias=moe.router_bias)
        aux_free = moe.load_balance == "aux_loss_free"
        # Persistent only when used: a model trained without it checkpoints and exports no bias.
        self.register_buffer("expert_bias", torch.zeros(moe.num_experts), persistent=aux_free)

    def forward(self, x: torch.Tensor) -> Routing:
        """x [tokens, dim] -> the routing of each token."""
        moe = self.moe
        bias = None if self.gate.bias is None else local_tensor(self.gate.bias).float()
        logits = F.linear(x.float(), local_tensor(self.gate.weight).float(), bias)
        scores = logits.softmax(dim=-1) if moe.score_func == "softmax" else logits.sigmoid()
        selection = scores + self.expert_bias if moe.load_balance == "aux_loss_free" else scores
        if moe.num_expert_groups > 1:
            selection = _within_best_groups(selection, moe.num_expert_groups, moe.num_limited_groups)
        experts = selection.topk(moe.top_k, dim=-1).indices
        weights = scores.gather(-1, experts)
        if moe.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        weights = weights * moe.routed_scaling_factor
        with torch.no_grad():
            counts = torch.zeros(moe.num_experts, device=x.device, dtype=torch.int64)
            counts.scatter_add_(0, experts.reshape(-1), torch.ones_like(experts.reshape(-1)))
        return Routing(experts, weights, scores, counts)

    @torch.no_grad()
    def update_bias(self, tokens_per_expert: torch.Tensor) -> None:
        """Move each expert's bias by bias_update_rate toward the mean load: up when it got fewer tokens than
        the mean, down when more (tokens_per_expert: this layer's counts over the whole step)."""
        load = tokens_per_expert.to(self.expert_bias.device, torch.float32)
        self.expert_bias.add_(self.moe.bias_update_rate * torch.sign(load.mean() - load))

    def reset_parameters(self, init, std: float = 0.02) -> None:
        init.trunc_normal_(self.gate.weight, std=std)
        if self.gate.bias is not None:
            init.trunc_normal_(self.gate.bias, std=std)  # as Hugging Face initialises GPT-OSS's router bias
        self.expert_bias.zero_()


def _within_best_groups(selection: torch.Tensor, groups: int, limited: int) -> torch.Tensor:
    """`selection` [tokens, experts] with every expert outside each token's `limited` best groups at -inf; a
    group's score is the sum of its two best selection scores (DeepSeek-V3's node-limited routing)."""
    grouped = selection.view(selection.shape[0], groups, -1)
    best = grouped.topk(2, dim=-1).values.sum(-1).topk(limited, dim=-1).indices
    keep = torch.zeros(selection.shape[0], groups, dtype=torch.bool, device=selection.device)
    keep.scatter_(1, best, True)
    return grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view_as(selection)
