"""The real side of the memory check: one config's training steps in a fresh process, measured as the dry
run's prediction is meant to be read.

    python -m gpu_checks.memory_driver OUT.json [titan-train options...]

The config is the one the dry run simulates (titan_train.simulate.dry_run.simulated_config: checkpoints and
validation off, the optimizer a CUDA run picks), except that a compiled config runs compiled here: the dry
run models compiled blocks eager, and how far compile moves the real peak is part of what is measured. The
Trainer reads synthetic batches and runs dry_run.STEPS steps, as the dry run does.
CUDA: torch.cuda.max_memory_allocated and max_memory_reserved over the whole process (build included).
CPU: the peak active bytes of titan-debug's AllocationTracker over the same phases (what the dry run
measures on fake tensors), and no reserved figure.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch

from titan_train.config import load_config, parse_argv
from titan_train.run.distributed import init_distributed, shutdown_distributed
from titan_train.run.trainer import Trainer
from titan_train.simulate.dry_run import STEPS, simulated_config
from titan_train.simulate.step_memory import measure_steps, synthetic_batches


def cuda_peaks(config, env) -> dict:
    torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(config, env, batches=synthetic_batches(config))
    for _ in range(STEPS):
        trainer.step()
    torch.cuda.synchronize()
    return {
        "peak_active_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "num_alloc_retries": torch.cuda.memory_stats().get("num_alloc_retries", 0),
        "measured_by": "torch.cuda.max_memory_allocated / max_memory_reserved",
    }


def tracker_peaks(config, env) -> dict:
    tracker, held, _ = measure_steps(config, env, STEPS)
    peak = tracker.peak_active()
    return {
        "peak_active_bytes": peak.bytes,
        "peak_reserved_bytes": None,
        "peak_op": peak.op,
        "peak_phase": peak.phase,
        "held_bytes": held,
        "measured_by": "titan_debug AllocationTracker (CPU: no caching allocator, no reserved figure)",
    }


def main(out: str, argv: list[str]) -> None:
    requested = load_config(parse_argv(argv))
    config, _ = simulated_config(requested)
    env = init_distributed(config)
    try:
        if env.device.type == "cuda":
            result = cuda_peaks(dataclasses.replace(config, compile=requested.compile), env)
        else:
            result = tracker_peaks(config, env)  # eager: the tracker follows the ops as the dry run does
        result.update(steps=STEPS, compiled=requested.compile.enable and env.device.type == "cuda")
        Path(out).write_text(json.dumps(result, indent=1))
    finally:
        shutdown_distributed()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
