"""A model's routing ledger: its mixture-of-experts layers' auxiliary loss, expert loads and routing statistics,
in one object a trainer reads (titan_parallel's expert balancing does, by duck typing) instead of attributes
scattered over the model."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from titan_models.moe.args import MoEArgs
from titan_models.moe.balance import add_aux_loss_grad, load_balance_loss
from titan_models.moe.layer import MoE
from titan_models.moe.router import RoutedTokens


class RoutingStats(NamedTuple):
    """The training forwards' routing since the ledger was last read."""

    tokens_per_expert: torch.Tensor | None
    """[moe layers, experts] int64, the tokens each expert got; None when no training forward routed any."""
    aux_loss_sum: float
    """The sum of those forwards' auxiliary losses (unweighted)."""
    forwards: int
    """How many training forwards routed tokens."""


class RoutingLedger:
    """The routing of the mixture-of-experts layers under `blocks` (a model's ModuleDict of blocks, which
    pipeline stages thin out: the ledger reads whichever blocks are left).

    The model hands it the routings its blocks returned (`read`), once per forward after the blocks, so
    activation checkpointing's recompute (which re-runs the routers) counts nothing twice."""

    def __init__(self, moe: MoEArgs, blocks: nn.ModuleDict):
        self.moe = moe
        self.blocks = blocks
        self.aux_loss: torch.Tensor | None = None
        """The last forward's auxiliary loss (unweighted, differentiable); None when the model trains none."""
        self.loss_weight = 1.0
        self.expert_load: torch.Tensor | None = None
        self.aux_loss_sum, self.forwards = 0.0, 0

    def layers(self) -> dict[str, MoE]:
        """The mixture-of-experts layers the (possibly partial) model holds, by block key."""
        found = {}
        for key, block in self.blocks.items():
            layer = next((module for module in block.modules() if isinstance(module, MoE)), None)
            if layer is not None:
                found[key] = layer
        return found

    def set_loss_weight(self, weight: float) -> None:
        """How much one unit of the next forwards' training loss weighs in the gradient (e.g. 1 / micro-batches):
        the auxiliary loss joins the gradient with weight x moe.aux_loss_coef."""
        self.loss_weight = weight

    def read(self, hidden: torch.Tensor, routings: list[RoutedTokens]) -> torch.Tensor:
        """After the blocks: the forward's auxiliary loss (`aux_loss`), put into the gradient through `hidden`
        (returned), and when gradients are on (training) the tokens each expert got, added to the ledger."""
        if not routings:
            return hidden
        self.aux_loss = load_balance_loss(self.moe.load_balance, routings)
        if torch.is_grad_enabled():
            load = torch.stack([r.tokens_per_expert for r in routings])
            self.expert_load = load if self.expert_load is None else self.expert_load + load
            self.forwards += 1
            if self.aux_loss is not None:
                self.aux_loss_sum += self.aux_loss.detach()
        return add_aux_loss_grad(hidden, self.aux_loss, self.moe.aux_loss_coef * self.loss_weight)

    def take(self) -> RoutingStats:
        """The training forwards' routing since the last call, and a fresh start."""
        stats = RoutingStats(self.expert_load, float(self.aux_loss_sum), self.forwards)
        self.expert_load, self.aux_loss_sum, self.forwards = None, 0.0, 0
        return stats

    def update_expert_bias(self, load: torch.Tensor) -> None:
        """Auxiliary-loss-free balancing: move each layer's selection bias against `load` (the step's tokens per
        expert over every data-parallel rank and micro-batch, in the order `take` gives them)."""
        if self.moe.load_balance != "aux_loss_free":
            return
        for layer, layer_load in zip(self.layers().values(), load, strict=True):
            layer.router.update_bias(layer_load)
