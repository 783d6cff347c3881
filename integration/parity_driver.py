"""Runs a few training steps of the real Trainer and saves what a parity test compares.

    torchrun --nproc_per_node N parity_driver.py OUT.pt [--emulate-dp W] [titan-train options...]

Saves (rank 0): the per-step losses, the grad norm, every parameter's full gradient after step 1, the MoE
selection biases after the last step, every rank's applied layout (titan_parallel.describe_applied, read
from the live model before step 1) and the collectives each rank's flight recorder saw in step 1 (op ->
sizes of the process groups it ran on), and with multi-token prediction each step's mtp_loss_1.. and
mtp_loss_weight (Trainer.mtp_metrics; empty dicts without).
`--emulate-dp W` makes a single process see the same global batch as W data-parallel ranks: each step
accumulates W micro-batches, micro-batch k drawn from data shard k, so it is the reference for dp = W (with
--training.global_batch_size G: G / local_batch_size micro-batches in turn from the W shards, the reference
for dp = W with gradient accumulation).
"""

import itertools
import pickle
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from titan_parallel.model.applied_layout import clean_fqn
from titan_train.config import load_config, parse_argv
from titan_train.data import build_dataloader
from titan_train.run.dataloading import training_dataloader_args
from titan_train.run.distributed import init_distributed, shutdown_distributed
from titan_train.run.trainer import Trainer


def full(t: torch.Tensor) -> torch.Tensor:
    """A plain CPU copy of the whole tensor, gathered if it is a DTensor."""
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().clone()


def full_grads(parts: list[torch.nn.Module]) -> dict[str, torch.Tensor]:
    # Frozen parameters (a LoRA base) have no gradient.
    named = [(name, param) for part in parts for name, param in part.named_parameters() if param.grad is not None]
    return merged_over_ranks({clean_fqn(name): full(param.grad) for name, param in named}, equal_copies=True)


def merged_over_ranks(tensors: dict[str, torch.Tensor], *, equal_copies: bool = False) -> dict[str, torch.Tensor]:
    """Every rank's entries in one dict (on every rank): pipeline stages hold different parameters. equal_copies: a
    name several ranks hold (data-parallel replicas, a shared embedding's copies on the first and the last
    pipeline stage) must hold equal values on each."""
    merged: dict[str, torch.Tensor] = {}
    for entries in every_rank(tensors):
        for name, tensor in entries.items():
            if equal_copies and name in merged and not torch.equal(merged[name], tensor):
                difference = (merged[name] - tensor).abs().max().item()
                raise AssertionError(f"{name}: ranks hold different copies (max difference {difference:.3g})")
            merged[name] = tensor
    return merged


def every_rank(value) -> list:
    if not dist.is_initialized():
        return [value]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return everyone


def collectives_seen() -> dict[str, list[int]]:
    """What torch's flight recorders hold for this process: each collective ("gloo:all_to_all",
    "nccl:all_to_all") and the sizes of the process groups it ran on. Empty on one process or with the
    recorder off."""
    if not dist.is_initialized():
        return {}
    groups = dist.distributed_c10d._world.pg_group_ranks.items()  # (not-a-member markers are ints)
    size_of = {pg.group_name: len(ranks) for pg, ranks in groups if isinstance(pg, dist.ProcessGroup)}
    seen: dict[str, set[int]] = {}
    for entry in _recorded_entries():
        seen.setdefault(entry["profiling_name"], set()).add(size_of.get(entry["process_group"][0], -1))
    return {name: sorted(sizes) for name, sizes in seen.items()}


def _recorded_entries() -> list[dict]:
    c10d, entries = torch._C._distributed_c10d, []
    # NCCL's recorder exists only in CUDA builds; the backend-neutral one holds gloo's. A recorder that was
    # never initialized raises: the other may still hold entries.
    for dump in (getattr(c10d, name, None) for name in ("_dump_nccl_trace", "_dump_fr_trace")):
        try:
            entries += pickle.loads(dump()).get("entries", []) if dump is not None else []
        except RuntimeError:
            continue
    return entries


def emulated_dp_batches(trainer: Trainer, world: int):
    # Each emulated rank reads its rows of a global batch of world local batches: one micro-batch each.
    loaders = [
        iter(build_dataloader(**training_dataloader_args(trainer.config, trainer.tokenizer, k, world, 1)))
        for k in range(world)
    ]
    for k in itertools.cycle(range(world)):
        yield next(loaders[k])


def emulating_trainer(argv: list[str]) -> tuple[str, int, Trainer]:
    """OUT, the emulated data-parallel degree and the Trainer, from `OUT [--emulate-dp W] [options...]`
    (after init_distributed: the caller runs shutdown_distributed)."""
    out, rest = argv[0], argv[1:]
    emulate = 1
    if rest[:1] == ["--emulate-dp"]:
        emulate, rest = int(rest[1]), rest[2:]
    config = load_config(parse_argv(rest))
    if emulate > 1 and config.training.global_batch_size == -1:  # a given global batch means accumulation
        config.training.global_batch_size = config.training.local_batch_size * emulate
    trainer = Trainer(config, init_distributed(config))
    if emulate > 1:
        trainer.data_iter = emulated_dp_batches(trainer, emulate)
    return out, emulate, trainer


def main(argv: list[str]) -> None:
    try:
        out, _, trainer = emulating_trainer(argv)
        config, env = trainer.config, trainer.env
        applied = every_rank(trainer.parallel_model.applied_layout())
        losses, norms, grads, mtp = [], [], None, []
        for step in range(config.training.steps):
            loss, grad_norm, _ = trainer.step()
            losses.append(loss)
            norms.append(grad_norm)
            mtp.append(dict(trainer.mtp_metrics))
            if step == 0:
                grads = full_grads(trainer.model_parts)
                collectives = every_rank(collectives_seen())
        # State the optimizer does not hold, after the last step: e.g. a mixture of experts' selection biases.
        buffers = merged_over_ranks(
            {clean_fqn(name): full(b) for part in trainer.model_parts for name, b in part.state_dict().items()
             if name.endswith("expert_bias")}
        )  # fmt: skip
        if env.rank == 0:
            torch.save(
                {"losses": losses, "grad_norms": norms, "grads": grads, "applied": applied, "buffers": buffers,
                 "collectives": collectives, "mtp": mtp}, out,
            )  # fmt: skip
    finally:
        shutdown_distributed()


if __name__ == "__main__":
    main(sys.argv[1:])
