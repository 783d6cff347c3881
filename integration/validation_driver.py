"""Trains a few steps with the real Trainer, then evaluates the validation loss; saves (rank 0) the training
losses and the validation loss.

    torchrun --nproc_per_node N validation_driver.py OUT.pt [--emulate-dp W] [titan-train options...]

`--emulate-dp W` (one process): the reference for dp = W. Training sees the W ranks' micro-batches
(parity_driver's emulation) and the global batch is W local batches, so this one process validates global
batches of the same sequences as W data-parallel ranks: no emulation of validation, which counts global
batches whatever the layout.
"""

import sys

import torch

from parity_driver import emulating_trainer, every_rank
from titan_train.run.distributed import shutdown_distributed
from titan_train.run.validation import Validator


def main(argv: list[str]) -> None:
    try:
        out, _, trainer = emulating_trainer(argv)
        config, env = trainer.config, trainer.env
        validator = Validator(config, trainer.parallel_model, trainer.tokenizer, env.device)
        applied = every_rank(trainer.parallel_model.applied_layout())
        losses = [trainer.step()[0] for _ in range(config.training.steps)]
        validation = validator.run()["validation_loss"]
        if env.rank == 0:
            torch.save({"losses": losses, "validation_loss": validation, "applied": applied}, out)
    finally:
        shutdown_distributed()


if __name__ == "__main__":
    main(sys.argv[1:])
