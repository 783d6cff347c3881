"""What the multi-process tests share: launching a script as the ranks of a process group (test side), and running
the script's named cases in order, printing "rank R NAME ok" or the failure (script side)."""

import os
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path


def launch(script: Path, nproc: int, *args: str, timeout: int = 900) -> str:
    """stdout + stderr of `script args...` as the `nproc` ranks of a gloo group (forked_ranks: torchrun's variables,
    the ranks forked from a server that imported torch and Titan), one thread per rank."""
    from forked_ranks import run_ranks  # tools/, on the test's path (the repository's conftest.py), not the ranks'

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = run_ranks([sys.executable, str(script), *args], nproc, timeout, env=env)
    return result.stdout + result.stderr


def run_cases(build_cases: Callable[[], dict], *, deterministic: bool = False, fresh_compile: bool = False) -> None:
    """In each rank (gloo): build the cases (after the process group exists: they make meshes) and run them.

    fresh_compile: reset dynamo before each case, so cases compiling the same block code stay under the
    recompile limit.
    """
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=120))  # a failed peer must not hang the test
    rank = dist.get_rank()
    torch.use_deterministic_algorithms(deterministic)
    for name, case in build_cases().items():
        if fresh_compile:
            torch._dynamo.reset()
        try:
            case()
            print(f"rank {rank} {name} ok", flush=True)
        except Exception:
            print(f"rank {rank} {name} FAILED\n{traceback.format_exc()}", flush=True)
            break  # a failed case can leave peers mid-collective; later cases would hang
    dist.destroy_process_group()
