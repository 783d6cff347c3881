"""The validation loop (`[validation]`): every `freq` steps, the loss on a held-out dataset, forward only under
no_grad on the training layout (FSDP, TP with loss parallel, CP, PP through the schedule's forward-only pass).

`validation.steps` counts global batches, as training counts steps: one is validation.local_batch_size x
data-parallel degree x the layout's accumulation steps sequences, read in the layout-invariant order, so every
layout evaluates the same sequences (one process reads a global batch as accumulation-many local batches, N
data-parallel ranks each read their rows of it). The loss is the mean over every token evaluated: each local
batch's loss is a mean over equal-sized micro-batches (`ParallelModel.forward_loss`), averaged over the
data/cp ranks (`mean_loss`), then over batches, all of which hold the same number of tokens (a last global
batch that is not full is left out). Each evaluation builds its own dataloader in the source order, so every
evaluation sees the same batches, and touches neither the training dataloader nor any RNG (the torch RNG is
forked around it: a dataloader draws its base seed from it).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from titan_parallel import ParallelModel
from titan_train.config.sections import JobConfig
from titan_train.data import build_dataloader
from titan_train.data.tokenizer import Tokenizer
from titan_train.run.dataloading import validation_dataloader_args


class Validator:
    """Runs the evaluation when it is due; `run()` on every rank (it is a sequence of collectives)."""

    def __init__(self, config: JobConfig, model: ParallelModel, tokenizer: Tokenizer, device: torch.device):
        v, t = config.validation, config.training
        self.enabled, self.freq, self.steps = v.enable, v.freq, v.steps
        self.last_step = t.steps
        self.model, self.device = model, device
        dims = model.layout.dims
        self.loader_args = validation_dataloader_args(
            config, tokenizer, dims.local_rank("dp"), dims.dp, model.layout.accumulation_steps
        )

    def due(self, step: int) -> bool:
        return self.enabled and (step % self.freq == 0 or step == self.last_step)

    def run(self) -> dict[str, float]:
        """{"validation_loss", "validation_perplexity"} over the dataset (or `steps` global batches)."""
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            total, global_batches = 0.0, 0
            data = iter(build_dataloader(**self.loader_args))
            rows, accumulation = self.loader_args["local_batch_size"], self.loader_args["accumulation_steps"]
            while self.steps == -1 or global_batches < self.steps:
                local = [next(data, None) for _ in range(accumulation)]  # this rank's rows of one global batch
                # A finite split ends in a short batch: left out, as every batch must hold as many tokens.
                full = all(batch is not None and batch[0].shape[0] == rows for batch in local)
                if not _every_rank_has(full, self.device):
                    break  # ranks' shares of a finite split may differ by a batch: stop together
                for batch in local:
                    inputs, labels = (t.to(self.device) for t in batch)
                    total += self.model.mean_loss(self.model.forward_loss(inputs, labels))
                global_batches += 1
        if global_batches == 0:
            raise ValueError(
                f"validation.dataset={self.loader_args['dataset']!r} yields no batch of "
                f"{self.loader_args['local_batch_size']} x {self.loader_args['seq_len']} tokens on some "
                "data-parallel rank; use a larger dataset or smaller validation.local_batch_size / seq_len"
            )
        loss = total / (global_batches * accumulation)  # the mean over equal-sized local batches
        return {"validation_loss": loss, "validation_perplexity": math.exp(min(loss, 700.0))}


def _every_rank_has(mine: bool, device: torch.device) -> bool:
    if not dist.is_initialized():
        return mine
    flag = torch.tensor([int(mine)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())
