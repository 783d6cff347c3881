"""Launch the trainer the way users do (`titan-train`, `torchrun ... -m titan_train`), or its ranks forked from a
process that imported torch once (`run_ranks`: the same variables as under torchrun), as most tests do."""

import functools
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import forked_ranks  # tools/, on the path (the repository's conftest.py)

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
    """`cmd` (`python -m module args` or `python script args`) as the `nproc` ranks of one process group on this
    host (nproc None: one plain process), forked from a server that imported torch and Titan once
    (tools/forked_ranks.py: a rank killed by a signal is started once more, with a warning)."""
    return forked_ranks.run_ranks(cmd, nproc, timeout, env=_env(), cwd=ROOT)


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
