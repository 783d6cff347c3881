"""Semi-synchronous replica groups (`fault_tolerance.semi_sync_method`): each group takes its own optimizer
steps and the groups synchronise every `sync_steps`, through torchft's LocalSGD and DiLoCo, which hook the
optimizer's step (`register_step_post_hook`).

- local_sgd (Stich, https://arxiv.org/abs/1805.09767): the parameters are replaced by their mean over the live
  groups.
- diloco (Douillard et al., https://arxiv.org/abs/2311.08105): with θ the parameters at the last
  synchronisation and θ_g group g's after its sync_steps local steps, the pseudo-gradient θ − mean_g(θ_g) is
  applied to θ by an outer SGD (outer_lr, Nesterov momentum outer_momentum); every group continues from the
  result. The inner optimizer's state (AdamW moments) is kept across synchronisations.

A synchronisation during which a group fails is not committed: local_sgd keeps each group's parameters, diloco
goes back to θ; the live groups go on.
"""

from __future__ import annotations

import torch

from titan_train.config.sections import FaultTolerance


def build_semi_sync(cfg: FaultTolerance, manager, parts: list, optimizers: list):
    """torchft's LocalSGD or DiLoCo over the model, entered (its optimizer hooks registered); None for "none"."""
    if cfg.semi_sync_method == "none":
        return None
    from torchft.local_sgd import DiLoCo, LocalSGD

    # One model and one optimizer: the config refuses semi-sync with pipeline stages (validate.py).
    (model,), (optimizer,) = parts, optimizers
    if cfg.semi_sync_method == "local_sgd":
        method = LocalSGD(manager, model, optimizer, sync_every=cfg.sync_steps)
    else:
        outer = torch.optim.SGD(model.parameters(), lr=cfg.outer_lr, momentum=cfg.outer_momentum, nesterov=True)
        # The copy of θ stays on the parameters' device (GPU memory: one more copy of this rank's shards).
        device = next(model.parameters()).device
        method = DiLoCo(manager, [model], optimizer, outer, sync_every=cfg.sync_steps, backup_device=device,
                        pin_memory=False)  # fmt: skip
    return method.__enter__()
