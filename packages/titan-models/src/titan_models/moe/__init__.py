"""Mixture of experts, parallelism-agnostic: router, grouped experts, the layer, its load balancing, and the
routing ledger a model keeps of them (auxiliary loss, expert loads) for the trainer."""

from titan_models.moe.args import LOAD_BALANCE_CHOICES, MoEArgs
from titan_models.moe.balance import add_aux_loss_grad, load_balance_loss, sequence_aux_loss, switch_aux_loss
from titan_models.moe.experts import GroupedExperts
from titan_models.moe.grouped_mm import grouped_mm, grouped_mm_loop, grouped_mm_supported
from titan_models.moe.layer import MoE
from titan_models.moe.router import RoutedTokens, Routing, TopKRouter
from titan_models.moe.routing_ledger import RoutingLedger, RoutingStats

__all__ = [
    "LOAD_BALANCE_CHOICES",
    "GroupedExperts",
    "MoE",
    "MoEArgs",
    "RoutedTokens",
    "Routing",
    "RoutingLedger",
    "RoutingStats",
    "TopKRouter",
    "add_aux_loss_grad",
    "grouped_mm",
    "grouped_mm_loop",
    "grouped_mm_supported",
    "load_balance_loss",
    "sequence_aux_loss",
    "switch_aux_loss",
]
