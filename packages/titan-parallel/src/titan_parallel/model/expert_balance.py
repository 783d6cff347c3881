"""Mixture-of-experts bookkeeping that depends on the layout: the loss weight the auxiliary loss trains with,
each step's tokens per expert summed over the data-parallel ranks (for auxiliary-loss-free balancing and the
imbalance a run reports), and the auxiliary loss averaged like the training loss.

A model part takes part by owning a routing ledger as `part.routing` (titan_models' decoder does: a
titan_models.moe.RoutingLedger; None or absent: the part routes nothing), an object with:
    layers() -> {name: layer}        its mixture-of-experts layers (none: nothing to balance)
    set_loss_weight(weight)          the gradient weight of one unit of the next forwards' training loss
    take() -> (tokens per expert [moe layers, experts] or None, aux loss sum, forwards), since the last take
    update_expert_bias(load)         move the selection biases against the step's global load
    aux_loss                         the last forward's auxiliary loss; None when the model trains none
A part may own a second ledger as `part.mtp_routing` (the decoder's multi-token prediction modules): it trains
with the same loss weight and its selection biases move against its own global load, but it stays out of the
report (its aux loss, loads and imbalance), so the report's rows are the main model's MoE layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh


@dataclass
class RoutingReport:
    """One optimizer step's routing, over every rank."""

    aux_loss: float | None
    """The auxiliary load-balancing loss (unweighted), mean over micro-batches and data ranks, summed over
    pipeline stages; None when the model trains none."""
    imbalance: float
    """Tokens of the busiest expert over the mean tokens per expert, in the worst MoE layer (1.0 is even)."""
    tokens_per_expert: torch.Tensor
    """[this rank's MoE layers, experts]: the step's counts over every data rank and micro-batch."""


def routing_ledgers(parts: list[nn.Module]) -> list:
    """The routing ledgers of the parts that keep one."""
    ledgers = (getattr(part, "routing", None) for part in parts)
    return [ledger for ledger in ledgers if ledger is not None]


def mtp_routing_ledgers(parts: list[nn.Module]) -> list:
    """The second ledgers (`part.mtp_routing`) of the parts that keep one."""
    ledgers = (getattr(part, "mtp_routing", None) for part in parts)
    return [ledger for ledger in ledgers if ledger is not None]


def routes_experts(parts: list[nn.Module]) -> bool:
    """Whether any of these parts holds a mixture-of-experts layer."""
    return any(ledger.layers() for ledger in routing_ledgers(parts))


def set_loss_weight(parts: list[nn.Module], weight: float) -> None:
    for ledger in routing_ledgers(parts) + mtp_routing_ledgers(parts):
        ledger.set_loss_weight(weight)


def balance_experts(parts: list[nn.Module], data_mesh: DeviceMesh | None, gather_over_stages) -> RoutingReport:
    """After an optimizer step: sum each part's tokens per expert over the data ranks (`data_mesh`: those
    holding different tokens), update the selection biases from it, and report. A collective on every rank,
    called where some pipeline stage routes experts (routes_experts, over the stages), on every stage alike."""
    stats = [(ledger, *ledger.take()) for ledger in routing_ledgers(parts)]
    stats = [entry for entry in stats if entry[1] is not None]
    loads, aux_sum, forwards, trains_aux = [], 0.0, 0, False
    spread = data_mesh is not None and data_mesh.size() > 1
    for ledger in mtp_routing_ledgers(parts):  # balanced alike, kept out of the report
        load = ledger.take()[0]
        if load is not None:
            if spread:
                dist.all_reduce(load, group=data_mesh.get_group())
            ledger.update_expert_bias(load)
    for ledger, load, part_aux, part_forwards in stats:
        if spread:
            dist.all_reduce(load, group=data_mesh.get_group())
        ledger.update_expert_bias(load)
        loads.append(load)
        aux_sum, forwards = aux_sum + part_aux, max(forwards, part_forwards)
        trains_aux = trains_aux or ledger.aux_loss is not None
    aux = aux_sum / forwards if forwards else 0.0
    imbalance = 0.0
    if loads:  # this stage's data ranks all hold MoE layers, or none does
        if spread:
            mean = torch.tensor([aux], dtype=torch.float64, device=loads[0].device)
            dist.all_reduce(mean, group=data_mesh.get_group())
            aux = mean.item() / data_mesh.size()
        counts = torch.cat(loads).float()
        imbalance = (counts.amax(dim=1) / counts.mean(dim=1).clamp(min=1e-9)).max().item()
    trains_aux = any(gather_over_stages(float(trains_aux)))
    return RoutingReport(
        aux_loss=sum(gather_over_stages(aux)) if trains_aux else None,
        imbalance=max(gather_over_stages(imbalance)),
        tokens_per_expert=torch.cat(loads) if loads else torch.zeros(0, 0, dtype=torch.int64),
    )
