"""The tests' launcher of multi-process runs: a script or module as the ranks of one process group on this host,
forked from a server that imported torch and Titan once, with the variables torchrun
--standalone gives its workers (what env:// initialization reads), and no agent process. A process importing torch
and torch.distributed costs about 3 s of CPU on a 2-core machine, its agent under torchrun about 2 more: most of a
small multi-process test. As under torchrun, the first rank to fail stops the others.

Used by every package's tests and by integration/ (the repository's conftest.py puts tools/ on the path); the tests
about launching itself (restarts, elastic nodes, replica groups, SLURM) go through torchrun.

    proc = run_ranks([sys.executable, "script.py", *args], nproc=2, timeout=300)
    proc.returncode, proc.stdout, proc.stderr  # every rank's output, rank 0 first

A script of named checks ends with `run_named_checks(globals(), sys.argv[1:], mesh_shape=(2,))`; its test asserts
"rank R NAME ok" in the output for each rank and name.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import runpy
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

# What the fork server imports before forking: torch's distributed parts and every Titan package a test venv holds
# (the server skips what is not installed: a package's venv has only it and its dependencies).
PRELOAD = ("torch", "torch._dynamo", "torch.distributed.tensor", "torch.distributed.fsdp",
           "torch.distributed.checkpoint", "titan_models", "titan_parallel", "titan_float8", "titan_checkpoint",
           "titan_debug", "titan_train.cli.train", "titan_train.run.trainer")  # fmt: skip


def free_port() -> int:
    """A port free on 127.0.0.1 now (rank 0's store binds it a moment later, as torchrun --standalone does)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_ranks(
    argv: Sequence[str],
    nproc: int | None,
    timeout: float,
    *,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess:
    """`argv` (`python -m module args...` or `python script args...`) as the `nproc` ranks of one process group
    (nproc None: one plain process), each with `env` (default: this process's) plus its rank's variables, in `cwd`.
    stdout / stderr: every rank's, rank 0 first; returncode: the first failed rank's, else 0. A timeout raises
    subprocess.TimeoutExpired after stopping the ranks.

    A rank killed by a signal (a native crash: glibc's heap check has aborted a gloo rank once in some 300 launches
    of a CI run, "malloc(): unaligned tcache chunk detected", not reproduced in 40 reruns) is started again once,
    with a warning carrying the first try's stderr. A Python error, a timeout or a second crash still fails."""
    proc = _run_once(argv, nproc, timeout, env, cwd)
    if proc.returncode >= 0:
        return proc
    warnings.warn(f"a rank of {list(argv[1:3])} died by signal {-proc.returncode}; started again. Its stderr:\n"
                  f"{proc.stderr[-3000:]}", RuntimeWarning, stacklevel=2)  # fmt: skip
    return _run_once(argv, nproc, timeout, env, cwd)


def run_named_checks(
    namespace: dict[str, Callable],
    names: Sequence[str],
    mesh_shape: tuple[int, ...],
    mesh_dim_names: tuple[str, ...] | None = None,
    *,
    fresh_compile: bool = False,
) -> None:
    """In each rank started by run_ranks: join the gloo group, make a CPU mesh of `mesh_shape`, and call each
    function named in `names` (from `namespace`: a script's globals()) with it, printing "rank R NAME ok", or
    "rank R NAME failed" and its traceback, then the next. fresh_compile: reset dynamo before each, so checks
    compiling the same code stay under its recompile limit."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=mesh_dim_names)
        for name in names:
            if fresh_compile:
                torch._dynamo.reset()
            try:
                namespace[name](mesh)
                print(f"rank {rank} {name} ok", flush=True)
            except Exception:
                print(f"rank {rank} {name} failed\n{traceback.format_exc()}", flush=True)
    finally:
        dist.destroy_process_group()


def _run_once(argv, nproc, timeout, env, cwd) -> subprocess.CompletedProcess:
    base = dict(os.environ if env is None else env)
    if nproc is None:
        envs = [base]
    else:
        common = {"WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0",
                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # fmt: skip
        envs = [{**base, **common, "RANK": str(r), "LOCAL_RANK": str(r), "ROLE_RANK": str(r)} for r in range(nproc)]
    context = _fork_server()
    folder = str(Path(cwd).resolve()) if cwd is not None else os.getcwd()
    with tempfile.TemporaryDirectory() as logs:
        procs = [
            context.Process(target=_run_rank, args=(list(argv[1:]), rank_env, folder, f"{logs}/{rank}"))
            for rank, rank_env in enumerate(envs)
        ]
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + timeout
        timed_out = False
        first_failed = None  # the ranks that failed of themselves, before the others were stopped
        while any(p.exitcode is None for p in procs):
            timed_out = time.monotonic() > deadline
            first_failed = [p for p in procs if p.exitcode]
            if timed_out or first_failed:
                _stop(procs)
                break
            time.sleep(0.05)
        if timed_out:
            raise subprocess.TimeoutExpired(list(argv), timeout)
        out, err = ("".join(_read(f"{logs}/{rank}.{kind}") for rank in range(len(procs))) for kind in "12")
    returncode = next((p.exitcode for p in first_failed or procs if p.exitcode), 0)
    return subprocess.CompletedProcess(list(argv), returncode, out, err)


@functools.cache
def _fork_server():
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))  # read when the server starts: at the first rank's start
    return context


def _run_rank(args: list[str], env: dict, cwd: str, log_prefix: str) -> None:
    """In the forked rank: `python args...` (`-m module ...` or `script ...`) with this rank's environment,
    working folder and output files."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, kind in ((1, "1"), (2, "2")):
        with open(f"{log_prefix}.{kind}", "w") as log:
            os.dup2(log.fileno(), fd)
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args)
        sys.path.insert(0, str(Path(args[0]).resolve().parent))  # as `python script` puts the script's folder first
        runpy.run_path(args[0], run_name="__main__")


def _read(path: str) -> str:
    return Path(path).read_text() if Path(path).exists() else ""  # absent: the rank died before writing


def _stop(procs: list) -> None:
    """Terminate the ranks still running; kill those that do not exit within 10 s."""
    for p in procs:
        if p.exitcode is None:
            p.terminate()
    for p in procs:
        p.join(timeout=10)
        if p.exitcode is None:
            p.kill()
            p.join()
