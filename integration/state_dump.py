"""Builds the Trainer (which loads the latest checkpoint of the run) and saves, from rank 0, the full
model parameters and AdamW moments as plain tensors, before any step. Launched like parity_driver.py."""

import sys

import torch

from parity_driver import full, merged_over_ranks
from titan_parallel.model.applied_layout import clean_fqn
from titan_train.config import load_config, parse_argv
from titan_train.run.distributed import init_distributed, shutdown_distributed
from titan_train.run.trainer import Trainer


def save_full_states(trainer: Trainer, rank: int, out: str, with_step: bool = False) -> None:
    """Saved by rank 0 to `out`: the full parameters and optimizer moments (AdamW's step counts too if `with_step`)."""
    model, optimizer = {}, {}
    for part, part_optimizer in zip(trainer.model_parts, trainer.optimizer.optimizers, strict=True):
        for name, param in part.named_parameters():
            model[clean_fqn(name)] = full(param)
            for key, value in part_optimizer.state.get(param, {}).items():
                if with_step or key != "step":
                    optimizer[f"{clean_fqn(name)}.{key}"] = full(value)
    model, optimizer = merged_over_ranks(model), merged_over_ranks(optimizer)
    if rank == 0:
        torch.save({"step": trainer.step_count, "model": model, "optimizer": optimizer}, out)


def main(argv: list[str]) -> None:
    out, rest = argv[0], argv[1:]
    config = load_config(parse_argv(rest))
    env = init_distributed(config)
    try:
        save_full_states(Trainer(config, env), env.rank, out)
    finally:
        shutdown_distributed()


if __name__ == "__main__":
    main(sys.argv[1:])
