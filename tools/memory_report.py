"""Per-rank bytes of parameters, gradients and optimizer state for a parallel layout, measured from the
live tensors after one training step (titan_train/run/held_bytes.py: a DTensor counts its local shard only,
so FSDP's 1/N shows).

    torchrun --nproc_per_node 2 tools/memory_report.py --config configs/debug_model.toml
    python tools/memory_report.py --config configs/debug_model.toml          # one process

Takes the same options as titan-train.
"""

import sys

import torch.distributed as dist

from titan_train.config import load_config, parse_argv
from titan_train.run.distributed import init_distributed, shutdown_distributed
from titan_train.run.held_bytes import held_bytes
from titan_train.run.trainer import Trainer


def main(argv: list[str]) -> None:
    config = load_config(parse_argv([*argv, "--training.steps", "1", "--metrics.log_freq", "1000"]))
    env = init_distributed(config)
    try:
        trainer = Trainer(config, env)
        trainer.step()  # gradients and optimizer state exist only after a step
        mine = held_bytes(trainer.parameters(), trainer.optimizer.optimizers)
        rows = [None] * env.world_size if dist.is_initialized() else [mine]
        if dist.is_initialized():
            dist.all_gather_object(rows, mine)
        if env.rank == 0:
            mib = 2**20
            print(f"layout: {trainer.layout.describe()}")
            print(f"{'rank':>4}  {'params MiB':>10}  {'grads MiB':>10}  {'optimizer MiB':>13}  {'total MiB':>10}")
            for rank, r in enumerate(rows):
                total = sum(r.values())
                print(
                    f"{rank:>4}  {r['params'] / mib:>10.2f}  {r['grads'] / mib:>10.2f}  "
                    f"{r['optimizer'] / mib:>13.2f}  {total / mib:>10.2f}"
                )
    finally:
        shutdown_distributed()


if __name__ == "__main__":
    main(sys.argv[1:])
