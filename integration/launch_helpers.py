"""Launch the trainer the way users do (`titan-train`, `torchrun ... -m titan_train`), or its ranks forked from a
process that imported torch once (`run_ranks`: the same variables as under torchrun), as most tests do."""

import functools
import hashlib
import json
import multiprocessing
import os
import runpy
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEBUG_RECIPE = ROOT / "configs" / "debug_model.toml"


def _env() -> dict:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a rank killed by a signal prints every thread's Python stack
    if env.get("TITAN_TEST_BACKEND", "gloo") == "gloo":
        env["TITAN_DEVICE"] = "cpu"
    return env


def run_titan(
    args: list[str], nproc: int | None = 1, timeout: int = 600, torchrun: bool = False
) -> subprocess.CompletedProcess:
    """Run the trainer and return the finished process: `titan-train` (nproc None), or `python -m titan_train`
    as `nproc` ranks, started by `run_ranks` or, with torchrun=True, by torchrun itself (as users do)."""
    if nproc is None:
        cmd = [str(Path(sys.executable).parent / "titan-train"), *args]
    elif torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "titan_train", *args]  # fmt: skip
    else:
        return run_ranks([sys.executable, "-m", "titan_train", *args], nproc, timeout)
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=timeout, cwd=ROOT)


def run_ranks(cmd: list[str], nproc: int | None, timeout: int) -> subprocess.CompletedProcess:
    """`_run_ranks_once`, started once more (with a warning carrying the first try's stderr) when a rank was
    killed by a signal: glibc's heap check has aborted a gloo rank once in some 300 launches of a CI run
    ("malloc(): unaligned tcache chunk detected"; not reproduced in 40 reruns of that case), in native code
    outside Titan. A Python error, a timeout or a second crash still fails."""
    proc = _run_ranks_once(cmd, nproc, timeout)
    if proc.returncode >= 0:
        return proc
    warnings.warn(f"a rank of {cmd[1:3]} died by signal {-proc.returncode}; started again. Its stderr:\n"
                  f"{proc.stderr[-3000:]}", RuntimeWarning, stacklevel=2)  # fmt: skip
    return _run_ranks_once(cmd, nproc, timeout)


def _run_ranks_once(cmd: list[str], nproc: int | None, timeout: int) -> subprocess.CompletedProcess:
    """`cmd` (`python -m module args` or `python script args`) as the `nproc` ranks of one process group on this
    host, with the variables torchrun --standalone gives its workers (what env:// initialization reads), or as
    one plain process (nproc None). The processes are forked from a server that imported torch and Titan once
    (multiprocessing's forkserver) instead of each importing them, about 5 s of CPU per process and most of a
    small test's time on 2 cores, and without torchrun's agent process. As under torchrun, the first rank to
    fail stops the others. stdout / stderr: every rank's, rank 0 first."""
    if nproc is None:
        envs = [_env()]
    else:
        with socket.socket() as probe:  # a free port for rank 0's store, as torchrun --standalone picks one
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        common = {"WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0",
                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        envs = [{**_env(), **common, "RANK": str(r), "LOCAL_RANK": str(r), "ROLE_RANK": str(r)} for r in range(nproc)]
    context = _forkserver()
    with tempfile.TemporaryDirectory() as logs:
        procs = [
            context.Process(target=_run_rank, args=(cmd[1:], env, f"{logs}/{rank}")) for rank, env in enumerate(envs)
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
            raise subprocess.TimeoutExpired(cmd, timeout)
        out, err = ("".join(_read(f"{logs}/{rank}.{kind}") for rank in range(len(procs))) for kind in "12")
    returncode = next((p.exitcode for p in first_failed or procs if p.exitcode), 0)
    return subprocess.CompletedProcess(cmd, returncode, out, err)


# What every rank imports; the ranks then start with them imported. Modules read the environment at run time,
# not at import (each rank's variables are set before it runs).
_PRELOAD = ["torch", "torch._dynamo", "torch.distributed.tensor", "torch.distributed.fsdp",
            "torch.distributed.checkpoint", "titan_train.cli.train", "titan_train.run.trainer"]  # fmt: skip


@functools.cache
def _forkserver():
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    return context


def _run_rank(args: list[str], env: dict, log_prefix: str) -> None:
    """In the forked rank: `python args...` (`-m module ...` or `script ...`) with this rank's environment,
    working folder and output files."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(ROOT)
    for fd, kind in ((1, "1"), (2, "2")):
        with open(f"{log_prefix}.{kind}", "w") as log:
            os.dup2(log.fileno(), fd)
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args)
        sys.path.insert(0, str(Path(args[0]).parent))  # as `python script` puts the script's folder first
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


def read_metrics(dump_folder: Path) -> list[dict]:
    path = Path(dump_folder) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def parity_result(
    out: str, args: list[str], nproc: int | None, driver: str = "parity_driver.py", timeout: int = 900
) -> dict:
    """What `driver` (parity_driver.py or one built on it) saved at `out` after training with `args` (nproc None:
    one plain process, the reference with `--emulate-dp W` among args; else under torchrun)."""
    proc = run_script(driver, [out, *args], nproc=nproc, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    import torch

    return torch.load(out)


def parity_case(tmp_root: str, case_id: str, args: list[str], nproc: int) -> dict:
    """parity_result of a layout's run with `args` on `nproc` ranks, saved and dumped under tmp_root/case_id."""
    return parity_result(f"{tmp_root}/{case_id}.pt", [*args, "--job.dump_folder", f"{tmp_root}/{case_id}"], nproc)


@functools.cache
def single_process_reference(tmp_root: str, dp: int, options: tuple[str, ...]) -> dict:
    """parity_result of one plain process accumulating `dp` data ranks' micro-batches (`--emulate-dp`) with
    `options`: the reference of a parity case, run once per tmp_root and options."""
    name = hashlib.sha1("\0".join(options).encode()).hexdigest()[:16]  # options can be longer than a file name
    out = f"{tmp_root}/reference_dp{dp}_{name}.pt"
    return parity_result(out, ["--emulate-dp", str(dp), *options, "--job.dump_folder", f"{tmp_root}/ref"], nproc=None)


def run_script(script: str, args: list[str], nproc: int | None, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run a script from integration/ as one plain process (nproc None) or as `nproc` ranks (run_ranks)."""
    return run_ranks([sys.executable, str(Path(__file__).resolve().parent / script), *args], nproc, timeout)
