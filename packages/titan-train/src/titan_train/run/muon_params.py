"""Which parameters Muon updates and which AdamW does: a rule as data, by name and number of dimensions.

Muon is for hidden matrices: a Linear's weight (2-D), or a stack of experts' weights (3-D, one matrix per
expert). The embeddings, the output head, norms, biases, routers (their logits are a classifier, as the
head's) and Hyena's filters (a convolution over time, and the small network that makes it) go to AdamW,
as does every tensor of one dimension or more than three.
The default is written against Titan's model names; it belongs in each model's plan (a later change),
where a new family would declare its own.
"""

import fnmatch
import logging

from torch import nn

logger = logging.getLogger("titan")

# "*bias": a bias, and a stack of them (GPT-OSS's per-expert w1_bias: [experts, hidden], 2-D but no matrix).
DEFAULT_ADAMW_PARAMS = ("tok_embeddings", "output", "*norm*", "*bias", "router", "gate", "filter", "short_filter")


def takes_muon(name: str, ndim: int, adamw_params: list[str] | tuple[str, ...] = DEFAULT_ADAMW_PARAMS) -> bool:
    """True for a matrix or a stack of them that no pattern names; a pattern matches the whole name or any of
    its dotted parts (fnmatch globs: "output", "*norm*", "layers.0.*")."""
    if ndim not in (2, 3):
        return False
    parts = name.split(".")
    return not any(fnmatch.fnmatchcase(name, p) or any(fnmatch.fnmatchcase(x, p) for x in parts) for p in adamw_params)


def split_params(part: nn.Module, adamw_params: list[str] | tuple[str, ...]) -> tuple[list, list]:
    """(Muon's, AdamW's) (name, parameter) pairs of `part`, in its order."""
    muon, adamw = [], []
    for name, param in part.named_parameters():
        if param.requires_grad:
            (muon if takes_muon(name, param.ndim, adamw_params) else adamw).append((name, param))
    return muon, adamw


def describe_split(splits: list[tuple[list, list]], adamw_params: list[str] | tuple[str, ...]) -> str:
    """One line: how many tensors and elements each optimizer updates on this rank, and the rule."""
    muon = [p for m, _ in splits for _, p in m]
    adamw = [p for _, a in splits for _, p in a]
    stacks = sum(p.ndim == 3 for p in muon)
    return (
        f"optimizer: Muon for {len(muon)} tensors ({_elements(muon)} elements, {stacks} expert stacks), "
        f"AdamW for {len(adamw)} ({_elements(adamw)}); AdamW takes 1-D tensors and names matching "
        f"{list(adamw_params)} (optimizer.adamw_params)"
    )


def _elements(params: list) -> str:
    return f"{sum(p.numel() for p in params) / 1e6:.2f}M"
