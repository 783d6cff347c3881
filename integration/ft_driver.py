"""Trains as `titan-train` does, then saves from rank 0 of the process group the full parameters and AdamW
moments, as plain tensors, to OUT.pt: what a replica-group test compares between groups and with a plain run.

    torchrun --nproc_per_node N ft_driver.py OUT.pt [titan-train options...]

TITAN_TEST_STEP_SECONDS: seconds added to every step (after its quorum, or before with
TITAN_TEST_PAUSE_BEFORE_QUORUM=1), so that a tiny model's steps last long
against a restart (seconds of Python start-up here; in production steps of seconds against restarts of minutes).
"""

import logging
import os
import sys
import time

from state_dump import save_full_states
from titan_train.config import load_config, parse_argv
from titan_train.run.distributed import init_distributed, shutdown_distributed
from titan_train.run.run_record import record_run
from titan_train.run.trainer import Trainer


def main(argv: list[str]) -> None:
    out, rest = argv[0], argv[1:]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    config = load_config(parse_argv(rest))
    run = record_run(config)  # as titan-train: run.json, and run_id / restart in every metrics row
    env = init_distributed(config)
    try:
        trainer = Trainer(config, env, run)
        # The pause comes after the step's quorum: a group killed then fails the others' step in flight; with
        # TITAN_TEST_PAUSE_BEFORE_QUORUM=1 before it: a rank stopped then never asks for the step's quorum.
        pause, quorum = float(os.environ.get("TITAN_TEST_STEP_SECONDS", "0")), trainer.replicas.start_step
        if os.environ.get("TITAN_TEST_PAUSE_BEFORE_QUORUM") == "1":
            trainer.replicas.start_step = lambda: (time.sleep(pause), quorum())
        else:
            trainer.replicas.start_step = lambda: (quorum(), time.sleep(pause))
        trainer.train()
        save_full_states(trainer, env.rank, out, with_step=True)
    finally:
        shutdown_distributed()


if __name__ == "__main__":
    main(sys.argv[1:])
