"""The real training loop (Trainer.train) on 2 data-parallel ranks, where rank 1 issues one collective that
rank 0 never issues, just before step 3: a forced collective mismatch. The run must fail within
comm.train_timeout_seconds and leave flight-recorder dumps in <dump_folder>/comm_traces.

    torchrun --nproc_per_node 2 comm_mismatch_driver.py [titan-train options...]
"""

import sys

import torch
import torch.distributed as dist

from titan_train.config import load_config, parse_argv
from titan_train.run.distributed import init_distributed, shutdown_distributed
from titan_train.run.trainer import Trainer

EXTRA_NUMEL = 7  # a size no collective of the model has, so the dump shows which one it was


def main(argv: list[str]) -> None:
    config = load_config(parse_argv(argv))
    env = init_distributed(config)
    try:
        trainer = Trainer(config, env)
        if env.rank == 1:
            step, group = trainer.step, trainer.dims.submesh("dp_shard").get_group()

            def step_with_an_extra_collective():
                if trainer.step_count == 2:
                    dist.all_reduce(torch.ones(EXTRA_NUMEL), group=group)
                return step()

            trainer.step = step_with_an_extra_collective
        trainer.train()
    finally:
        shutdown_distributed()


if __name__ == "__main__":
    main(sys.argv[1:])
