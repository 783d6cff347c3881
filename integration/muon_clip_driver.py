"""A few Muon steps of the real Trainer with QK-clip (optimizer.muon_clip_threshold); saves (rank 0) the per-step
losses and largest logits (max_logit and max_logit/layer_<i>, Trainer.qk_clip_metrics) and every parameter, whole,
after the last step (parity_driver.py's launch and `--emulate-dp` reference); with validation.enable, a validation
where the training loop runs one.

    torchrun --nproc_per_node N muon_clip_driver.py OUT.pt [--emulate-dp W] [titan-train options...]
"""

import sys

import torch

from parity_driver import emulating_trainer, full, merged_over_ranks
from titan_parallel.model.applied_layout import clean_fqn
from titan_train.run.distributed import shutdown_distributed
from titan_train.run.validation import Validator


def main(argv: list[str]) -> None:
    try:
        out, _, trainer = emulating_trainer(argv)
        validator = Validator(trainer.config, trainer.parallel_model, trainer.tokenizer, trainer.env.device)
        losses, max_logits = [], []
        for _ in range(trainer.config.training.steps):
            losses.append(trainer.step()[0])
            max_logits.append({key: float(value) for key, value in trainer.qk_clip_metrics.items()})
            if validator.due(trainer.step_count):  # between steps, as the training loop runs it
                validator.run()
        params = merged_over_ranks(
            {clean_fqn(name): full(p) for part in trainer.model_parts for name, p in part.named_parameters()}
        )
        if trainer.env.rank == 0:
            torch.save({"losses": losses, "max_logits": max_logits, "params": params}, out)
    finally:
        shutdown_distributed()


if __name__ == "__main__":
    main(sys.argv[1:])
