"""A few Muon training steps of the real Trainer; saves (rank 0) the per-step losses and every parameter, whole,
after the last step (parity_driver.py's launch and `--emulate-dp` reference, parameters instead of gradients).

    torchrun --nproc_per_node N muon_parity_driver.py OUT.pt [--emulate-dp W] [titan-train options...]
"""

import sys

import torch

from parity_driver import emulating_trainer, full, merged_over_ranks
from titan_parallel.model.applied_layout import clean_fqn
from titan_train.run.distributed import shutdown_distributed


def main(argv: list[str]) -> None:
    try:
        out, _, trainer = emulating_trainer(argv)
        losses = [trainer.step()[0] for _ in range(trainer.config.training.steps)]
        params = merged_over_ranks(
            {clean_fqn(name): full(p) for part in trainer.model_parts for name, p in part.named_parameters()}
        )
        if trainer.env.rank == 0:
            torch.save({"losses": losses, "params": params}, out)
    finally:
        shutdown_distributed()


if __name__ == "__main__":
    main(sys.argv[1:])
