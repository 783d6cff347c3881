"""The reference for local_sgd / diloco with two replica groups, written out by hand in one process: two
Trainers (the same seed, each reading its group's rows of the global batch), each taking its own optimizer
steps, and every SYNC steps the outer update done here on plain tensors. Saves each group's per-step losses and
final parameters to OUT.pt.

    python semi_sync_reference.py OUT.pt {local_sgd|diloco} SYNC OUTER_LR OUTER_MOMENTUM [titan-train options...]
"""

import sys

import torch

from titan_parallel.model.applied_layout import clean_fqn
from titan_train.config import load_config, parse_argv
from titan_train.data import build_dataloader
from titan_train.run.distributed import init_distributed
from titan_train.run.trainer import Trainer

GROUPS = 2


def group_batches(config, trainer: Trainer, group: int):
    """Group `group`'s rows: data-parallel rank `group` of GROUPS (each group is one rank here)."""
    t = config.training
    return build_dataloader(dataset=t.dataset, dataset_path=t.dataset_path, tokenizer=trainer.tokenizer,
                            seq_len=t.seq_len, local_batch_size=t.local_batch_size, dp_rank=group,
                            dp_world_size=GROUPS, seed=t.seed)  # fmt: skip


@torch.no_grad()
def outer_update(method: str, params: list[list[torch.Tensor]], theta: list[torch.Tensor], momentum: list,
                 lr: float, mu: float) -> None:  # fmt: skip
    """params[g][i]: group g's parameter i, set in place to the synchronised value; theta: the parameters at the
    last synchronisation (diloco), updated in place; momentum: the outer momentum buffers (None before the first)."""
    for i, (a, b) in enumerate(zip(*params, strict=True)):
        if method == "local_sgd":
            new = (a + b) / GROUPS
        else:
            # Pseudo-gradient: how far the groups moved from theta, averaged; outer SGD with Nesterov momentum.
            delta = ((theta[i] - a) + (theta[i] - b)) / GROUPS
            momentum[i] = delta.clone() if momentum[i] is None else momentum[i] * mu + delta
            theta[i] -= lr * (delta + mu * momentum[i])
            new = theta[i]
        a.copy_(new)
        b.copy_(new)


def main(argv: list[str]) -> None:
    out, method, sync, lr, mu, rest = argv[0], argv[1], int(argv[2]), float(argv[3]), float(argv[4]), argv[5:]
    config = load_config(parse_argv(rest))
    env = init_distributed(config)
    trainers = []
    for group in range(GROUPS):
        trainer = Trainer(config, env, batches=[])  # the seed's weights; its batches are set below
        trainer.dataloader = group_batches(config, trainer, group)
        trainers.append(trainer)
    params = [list(t.model.parameters()) for t in trainers]
    theta = [p.detach().clone() for p in params[0]]
    momentum = [None] * len(theta)
    losses = [[], []]
    for step in range(1, config.training.steps + 1):
        for group, trainer in enumerate(trainers):
            losses[group].append(trainer.step()[0])
        if step % sync == 0:
            outer_update(method, params, theta, momentum, lr, mu)
    names = [clean_fqn(n) for n, _ in trainers[0].model.named_parameters()]
    final = [{n: p.detach().clone() for n, p in zip(names, group_params, strict=True)} for group_params in params]
    torch.save({"losses": losses, "model": final}, out)


if __name__ == "__main__":
    main(sys.argv[1:])
