"""Trains as `titan-train` does, then saves from rank 0 of the process group the full parameters and AdamW
moments, as plain tensors, to OUT.pt: what a replica-group test compares between groups and with a plain run.

    torchrun --nproc_per_node N ft_driver.py OUT.pt [titan-train options...]

TITAN_TEST_STEP_SECONDS: seconds added to every step (after its quorum), so that a tiny model's steps last long
against a restart (seconds of Python start-up here; in production steps of seconds against restarts of minutes).
"""

import logging
import os
import sys
import time

import torch

from parity_driver import full, merged_over_ranks
from titan_parallel.model.applied_layout import clean_fqn
from titan_train.config import load_config, parse_argv
from titan_train.run.distributed import init_distributed, shutdown_distributed
from titan_train.run.trainer import Trainer


def main(argv: list[str]) -> None:
    out, rest = argv[0], argv[1:]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    config = load_config(parse_argv(rest))
    env = init_distributed(config)
    try:
        trainer = Trainer(config, env)
        # The pause comes after the step's quorum: a group killed then fails the others' step in flight.
        pause, quorum = float(os.environ.get("TITAN_TEST_STEP_SECONDS", "0")), trainer.replicas.start_step
        trainer.replicas.start_step = lambda: (quorum(), time.sleep(pause))
        trainer.train()
        model, optimizer = {}, {}
        for part, part_optimizer in zip(trainer.model_parts, trainer.optimizer.optimizers, strict=True):
            for name, param in part.named_parameters():
                model[clean_fqn(name)] = full(param)
                for key, value in part_optimizer.state.get(param, {}).items():
                    optimizer[f"{clean_fqn(name)}.{key}"] = full(value)
        model, optimizer = merged_over_ranks(model), merged_over_ranks(optimizer)
        if env.rank == 0:
            torch.save({"step": trainer.step_count, "model": model, "optimizer": optimizer}, out)
    finally:
        shutdown_distributed()


if __name__ == "__main__":
    main(sys.argv[1:])
