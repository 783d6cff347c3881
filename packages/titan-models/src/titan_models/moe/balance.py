"""Load balancing across experts: the auxiliary losses, read from the routings of one forward."""

from __future__ import annotations

import torch

from titan_models.moe.router import RoutedTokens


def _probabilities(routing: RoutedTokens) -> torch.Tensor:
    """Each token's scores as a distribution over experts (sigmoid scores are normalised)."""
    scores = routing.scores
    return scores / scores.sum(dim=-1, keepdim=True)


def switch_aux_loss(routings: list[RoutedTokens]) -> torch.Tensor:
    """The auxiliary loss Hugging Face computes for Qwen3-MoE (`load_balancing_loss_func` without a mask):
    num_experts * sum_e f_e * P_e, where f_e is the fraction of (token, choice) pairs sent to expert e and P_e
    its mean probability, both pooled over the tokens of every MoE layer given (not per layer)."""
    num_experts = routings[0].scores.shape[-1]
    rows = sum(r.scores.shape[0] for r in routings)
    assigned = torch.stack([r.tokens_per_expert for r in routings]).sum(0).float() / rows
    probability = torch.stack([_probabilities(r).sum(0) for r in routings]).sum(0) / rows
    return num_experts * (assigned * probability).sum()


def sequence_aux_loss(routing: RoutedTokens) -> torch.Tensor:
    """DeepSeek-V3's sequence-wise balance loss of one layer (equations 17-20, without alpha): per sequence,
    sum_e f_e * P_e with f_e = num_experts / (top_k * seqlen) * tokens routed to e and P_e the mean normalised
    score of e; averaged over the sequences."""
    bs, seqlen, top_k = routing.experts.shape
    num_experts = routing.scores.shape[-1]
    chosen = torch.zeros(bs, seqlen * top_k, num_experts, device=routing.scores.device)
    chosen.scatter_(2, routing.experts.reshape(bs, seqlen * top_k, 1), 1.0)
    fraction = chosen.sum(1) * num_experts / (top_k * seqlen)
    probability = _probabilities(routing).reshape(bs, seqlen, num_experts).mean(1)
    return (fraction * probability).sum(-1).mean()


def load_balance_loss(kind: str, routings: list[RoutedTokens]) -> torch.Tensor | None:
    """The unweighted auxiliary loss `kind` asks for over these layers' routings, or None (no loss)."""
    if not routings or kind not in ("aux_loss", "sequence_aux_loss"):
        return None
    if kind == "aux_loss":
        return switch_aux_loss(routings)
    return sum(sequence_aux_loss(r) for r in routings)


class _AddAuxLossGrad(torch.autograd.Function):
    """Identity on `hidden`; its backward also sends `weight` as the gradient of `aux_loss`. The auxiliary loss
    so joins the objective through the tensor every backward already passes (a pipeline stage's output
    included), without being added to the reported loss."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, aux_loss: torch.Tensor, weight: float) -> torch.Tensor:
        ctx.weight = weight
        ctx.aux_shape, ctx.aux_dtype = aux_loss.shape, aux_loss.dtype
        return hidden.view_as(hidden)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        aux_grad = torch.full(ctx.aux_shape, ctx.weight, dtype=ctx.aux_dtype, device=grad.device)
        return grad, aux_grad, None


def add_aux_loss_grad(hidden: torch.Tensor, aux_loss: torch.Tensor | None, weight: float) -> torch.Tensor:
    """`hidden`, through which backward adds `weight` * d(aux_loss) (nothing when there is no loss to train)."""
    if aux_loss is None or not aux_loss.requires_grad or weight == 0 or not torch.is_grad_enabled():
        return hidden
    return _AddAuxLossGrad.apply(hidden, aux_loss, weight)
