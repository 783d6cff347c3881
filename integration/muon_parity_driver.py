"""A few Muon training steps of the real Trainer; saves (rank 0) the per-step losses and every parameter, whole,
after the last step (parity_driver.py's launch and `--emulate-dp` reference, parameters instead of gradients),
and, for each Muon matrix a layout shards, its first step's update gathered whole ("updates") and its
placements ("placements", as text).

    torchrun --nproc_per_node N muon_parity_driver.py OUT.pt [--emulate-dp W] [titan-train options...]

The update is read back from the parameter: Muon's step is p1 = p0 (1 - lr wd) - lr' U, with lr' the
learning rate adjusted to the matrix's shape, so U = (p0 (1 - lr wd) - p1) / lr'. It is the orthogonalized
momentum, whatever Muon did with the shards: the test checks it was orthogonalized as one matrix.
"""

import sys

import torch
from torch.distributed.tensor import DTensor

from parity_driver import emulating_trainer, full, merged_over_ranks
from titan_parallel.model.applied_layout import clean_fqn
from titan_parallel.optim.muon import adjusted_lr
from titan_train.run.distributed import shutdown_distributed


def sharded_muon_matrices(trainer) -> dict[str, tuple[torch.nn.Parameter, float, float, str | None]]:
    """Each Muon parameter split over ranks (a DTensor with a Shard placement): name -> (parameter, lr, weight
    decay, adjust_lr_fn) of its optimizer group now, before the step that uses them."""
    groups = {
        id(p): group
        for optimizer in trainer.optimizer.optimizers
        for group in optimizer.param_groups
        if group["use_muon"]
        for p in group["params"]
    }
    found = {}
    for part in trainer.model_parts:
        for name, p in part.named_parameters():
            if id(p) in groups and isinstance(p, DTensor) and any(x.is_shard() for x in p.placements):
                group = groups[id(p)]
                found[clean_fqn(name)] = (p, group["lr"], group["weight_decay"], group["adjust_lr_fn"])
    return found


def main(argv: list[str]) -> None:
    try:
        out, _, trainer = emulating_trainer(argv)
        watched = sharded_muon_matrices(trainer)
        before = {name: full(p) for name, (p, *_) in watched.items()}
        losses = [trainer.step()[0]]
        updates = {}
        for name, (p, lr, weight_decay, adjust_lr_fn) in watched.items():
            moved = before[name] * (1 - lr * weight_decay) - full(p)
            updates[name] = moved / adjusted_lr(lr, adjust_lr_fn, p.shape)
        losses += [trainer.step()[0] for _ in range(trainer.config.training.steps - 1)]
        params = merged_over_ranks(
            {clean_fqn(name): full(p) for part in trainer.model_parts for name, p in part.named_parameters()}
        )
        updates = merged_over_ranks(updates)
        placements = merged_over_ranks({name: str(p.placements) for name, (p, *_) in watched.items()})
        if trainer.env.rank == 0:
            torch.save({"losses": losses, "params": params, "updates": updates, "placements": placements}, out)
    finally:
        shutdown_distributed()


if __name__ == "__main__":
    main(sys.argv[1:])
