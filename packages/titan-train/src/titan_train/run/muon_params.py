"""Which parameters Muon updates and which AdamW does: a rule of the model's plan (titan_models ModelPlan.adamw_params,
per family), which `optimizer.adamw_params` replaces where it is set.

Muon is for hidden matrices: a Linear's weight (2-D), or a stack of experts' weights (3-D, one matrix per
expert). The embeddings, the output head, norms, biases, routers and gates, convolutions and filters go to AdamW,
by name, as every tensor of one dimension or more than three does whatever its name (takes_matrix_optimizer).
"""

import logging

from torch import nn

from titan_models.plan import takes_matrix_optimizer

logger = logging.getLogger("titan")

PLAN_SOURCE = "the model's plan"
CONFIG_SOURCE = "optimizer.adamw_params"


def adamw_rule(configured: list[str], plan_rule: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """(the patterns of the parameters AdamW takes, where they come from): `optimizer.adamw_params` where it is
    set (not empty), else the model plan's rule."""
    if configured:
        return tuple(configured), CONFIG_SOURCE
    return tuple(plan_rule), PLAN_SOURCE


def split_params(part: nn.Module, adamw_params: list[str] | tuple[str, ...]) -> tuple[list, list]:
    """(Muon's, AdamW's) (name, parameter) pairs of `part`, in its order."""
    muon, adamw = [], []
    for name, param in part.named_parameters():
        if param.requires_grad:
            (muon if takes_matrix_optimizer(name, param.ndim, adamw_params) else adamw).append((name, param))
    return muon, adamw


def describe_split(splits: list[tuple[list, list]], adamw_params: list[str] | tuple[str, ...], source: str) -> str:
    """One line: how many tensors and elements each optimizer updates on this rank, the rule and its source."""
    muon = [p for m, _ in splits for _, p in m]
    adamw = [p for _, a in splits for _, p in a]
    stacks = sum(p.ndim == 3 for p in muon)
    return (
        f"optimizer: Muon for {len(muon)} tensors ({_elements(muon)} elements, {stacks} expert stacks), "
        f"AdamW for {len(adamw)} ({_elements(adamw)}); AdamW takes 1-D tensors and names matching "
        f"{list(adamw_params)} ({source})"
    )


def _elements(params: list) -> str:
    return f"{sum(p.numel() for p in params) / 1e6:.2f}M"
