"""Launch the trainer the way users do: `torchrun ... -m titan_train` or `titan-train`."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEBUG_RECIPE = ROOT / "configs" / "debug_model.toml"


def _env() -> dict:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    if env.get("TITAN_TEST_BACKEND", "gloo") == "gloo":
        env["TITAN_DEVICE"] = "cpu"
    return env


def run_titan(args: list[str], nproc: int | None = 1, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run the trainer (under torchrun when nproc is given) and return the finished process."""
    if nproc is None:
        cmd = [str(Path(sys.executable).parent / "titan-train"), *args]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            "-m",
            "titan_train",
            *args,
        ]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=timeout, cwd=ROOT)


def read_metrics(dump_folder: Path) -> list[dict]:
    path = Path(dump_folder) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def parity_result(out: str, args: list[str], nproc: int | None) -> dict:
    """What parity_driver.py saved at `out` after training with `args` (nproc None: one plain process, the
    reference with `--emulate-dp W` among args; else under torchrun)."""
    proc = run_script("parity_driver.py", [out, *args], nproc=nproc)
    assert proc.returncode == 0, proc.stderr[-4000:]
    import torch

    return torch.load(out)


def run_script(script: str, args: list[str], nproc: int | None, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run a script from integration/ directly (nproc None) or under torchrun."""
    path = str(Path(__file__).resolve().parent / script)
    if nproc is None:
        cmd = [sys.executable, path, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", path, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=timeout, cwd=ROOT)
