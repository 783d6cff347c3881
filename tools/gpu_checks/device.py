"""What the checks ran on and with: the device, torch and CUDA versions, the commit; and the results file's
name, `<date>-<device slug>`, so runs on different GPUs (and days) sit side by side in gpu_results/."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from gpu_checks import ROOT

GIB = 1024**3
PACKAGES = ("titan-models", "titan-parallel", "titan-float8", "titan-checkpoint", "titan-debug", "titan-train")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def cuda_device() -> dict | None:
    """The first CUDA device (name, compute capability, memory), or None where torch sees none."""
    import torch  # here, not at the top: listing the checks needs no torch

    if not torch.cuda.is_available():
        return None
    properties = torch.cuda.get_device_properties(0)
    return {
        "name": properties.name,
        "capability": [properties.major, properties.minor],
        "memory_gib": round(properties.total_memory / GIB, 2),
        "count": torch.cuda.device_count(),
    }


def cpu_device() -> dict:
    return {"name": f"CPU rehearsal ({platform.processor() or platform.machine()})", "capability": None}


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _commit() -> dict:
    """The commit checked. A machine the tree was copied to (tools/gpu_check_offline.sh) is told it by the one
    that sent it: a .git there, if any, is not the sender's."""
    sent = os.environ.get("TITAN_GPU_CHECK_COMMIT")
    if sent:
        return {"git_commit": sent, "git_dirty": None}
    return {
        "git_commit": _git("rev-parse", "HEAD").strip() or None,
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no").strip()),
    }


def versions() -> dict:
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        **_commit(),
        "packages": {name: _installed(name) for name in PACKAGES},
    }


def results_stem(out: Path, date: str, device: dict, cuda: bool) -> str:
    """`<date>-<device>`, with -2, -3, ... when a run of the same day on the same device is already in `out`."""
    stem = f"{date}-{slug(device['name']) if cuda else 'cpu-rehearsal'}"
    taken = {p.stem for p in out.glob(f"{stem}*.json")}
    return next(s for s in (stem, *(f"{stem}-{n}" for n in range(2, len(taken) + 3))) if s not in taken)
