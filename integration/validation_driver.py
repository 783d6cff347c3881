"""Trains a few steps with the real Trainer, then evaluates the validation loss; saves (rank 0) the training
losses and the validation loss.

    torchrun --nproc_per_node N validation_driver.py OUT.pt [--emulate-dp W] [titan-train options...]

`--emulate-dp W` (one process): the reference for dp = W. Training sees the W ranks' micro-batches
(parity_driver's emulation); validation is recomputed here, independently of titan_train.run.validation: the
plain mean of the per-batch losses of the batches the W data-parallel ranks would evaluate, in lockstep,
stopping when one of them runs out of full batches.
"""

import itertools
import sys

import torch

from parity_driver import emulating_trainer
from titan_train.data import build_dataloader
from titan_train.run.distributed import shutdown_distributed
from titan_train.run.validation import Validator


def emulated_validation_loss(validator: Validator, world: int) -> float:
    loaders = [iter(build_dataloader(**{**validator.loader_args, "dp_rank": k, "dp_world_size": world}))
               for k in range(world)]  # fmt: skip
    losses = []
    for _ in itertools.count() if validator.steps == -1 else range(validator.steps):
        batches = [next(loader, None) for loader in loaders]
        if any(batch is None or len(batch[0]) < validator.loader_args["local_batch_size"] for batch in batches):
            break
        losses += [validator.model.forward_loss(*batch).item() for batch in batches]
    return sum(losses) / len(losses)


def main(argv: list[str]) -> None:
    try:
        out, emulate, trainer = emulating_trainer(argv)
        config, env = trainer.config, trainer.env
        validator = Validator(config, trainer.parallel_model, trainer.tokenizer, env.device)
        losses = [trainer.step()[0] for _ in range(config.training.steps)]
        if emulate > 1:
            validation = emulated_validation_loss(validator, emulate)
        else:
            validation = validator.run()["validation_loss"]
        if env.rank == 0:
            torch.save({"losses": losses, "validation_loss": validation}, out)
    finally:
        shutdown_distributed()


if __name__ == "__main__":
    main(sys.argv[1:])
