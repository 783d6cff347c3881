"""What a check function gets: where to work, whether it runs on CUDA or rehearses on CPU, and a place to
record figures that survives a timeout (the result file is rewritten after every record, so the runner reads
what was measured before the process was killed)."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpu_checks import ROOT, TOOLS

TAIL_LINES = 30


PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """For Popen's preexec_fn (Linux): SIGKILL this process when its parent dies, so a runner killed outright
    leaves no check (and, a level down, no trainer) holding the GPU."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (AttributeError, OSError):
        pass  # not Linux: the runner's own kill of the process group still applies


class CheckFailed(Exception):
    """The check ran and what it shows is false (or a command it ran failed): recorded as `fail`."""


def tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def relative_error(predicted: float, real: float) -> float | None:
    return (predicted - real) / real if real else None


@dataclass
class Context:
    """`cuda` False: the CPU rehearsal (tiny sizes, float32, what a CPU can measure)."""

    cuda: bool
    work: Path
    result_path: Path
    deadline: float | None = None
    """time.monotonic() at which the runner kills this check (its budget, or less where the total budget is
    shorter); None: no limit."""
    figures: dict = field(default_factory=dict)
    comparisons: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    not_applicable: dict = field(default_factory=dict)
    """claim name -> why it does not apply on this GPU (gpu_checks.claims: an unmeasured claim otherwise fails)."""

    def seconds_left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def record(self, **figures) -> None:
        self.figures.update(figures)
        self.flush()

    def compare(self, case: str, quantity: str, predicted: float, real: float, unit: str) -> None:
        """A prediction against its measurement; the relative error is (predicted - real) / real."""
        error = relative_error(predicted, real)
        self.comparisons.append(
            {"case": case, "quantity": quantity, "predicted": predicted, "real": real, "unit": unit, "rel_error": error}
        )
        self.flush()

    def note(self, text: str) -> None:
        self.notes.append(text)
        self.flush()

    def claims_not_applicable(self, reason: str, *claims: str) -> None:
        """These claims' figures are not recorded here, for `reason` (also noted)."""
        self.not_applicable.update(dict.fromkeys(claims, reason))
        self.note(f"{', '.join(claims)}: not applicable: {reason}")

    def flush(self, **final) -> None:
        document = {"figures": self.figures, "comparisons": self.comparisons, "notes": self.notes,
                    "not_applicable": self.not_applicable, **final}  # fmt: skip
        temporary = self.result_path.with_suffix(".tmp")
        temporary.write_text(json.dumps(document, indent=1, default=str))
        temporary.replace(self.result_path)

    def env(self, **extra: str) -> dict:
        """The environment of the commands a check runs: the tools importable, CPU forced when rehearsing."""
        env = {**os.environ, **extra}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TOOLS), env.get("PYTHONPATH", "")) if p)
        if not self.cuda:
            env["TITAN_DEVICE"] = "cpu"
            env.setdefault("OMP_NUM_THREADS", "1")
        return env

    def start(self, argv: list[str], log: str, env: dict | None = None) -> subprocess.Popen:
        """Start a command in the background, its output going to WORK/LOG.log."""
        out = (self.work / f"{log}.log").open("w")
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env or self.env(), cwd=ROOT,
                                preexec_fn=die_with_parent)  # fmt: skip

    def finish(self, process: subprocess.Popen, log: str) -> str:
        """Wait for a started command; raises CheckFailed with its output's tail when it fails."""
        code = process.wait()
        output = (self.work / f"{log}.log").read_text(errors="replace")
        if code != 0:
            raise CheckFailed(f"{log}: exit code {code}\n{tail(output)}")
        return output

    def run(self, argv: list[str], log: str, env: dict | None = None) -> str:
        return self.finish(self.start(argv, log, env), log)

    def python(self, *args: str) -> list[str]:
        return [sys.executable, *args]
