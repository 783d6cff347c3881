"""Run the checks within a total time budget, each in its own process group with its own timeout, and judge
each one's claims on what it recorded (gpu_checks.claims).

A check starts only if its estimated duration fits in what is left of the total budget; one that does not is
skipped (`budget: ...`) and the next one, perhaps shorter, tried.

A check that fails, crashes or times out is recorded (with the figures it recorded before, and the tail of
its output) and the next one starts. The results are written after every check, and before each one with
that check marked `running`, so a run killed from outside still leaves a file that says how far it got. A
SIGTERM or Ctrl-C stops the running check, records it as a timeout and writes the results before exiting.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gpu_checks import ROOT, TOOLS
from gpu_checks.checks import Check
from gpu_checks.claims import apply_claims
from gpu_checks.context import die_with_parent, tail

MIN_START_S = 20  # what a check without an estimate needs left of the total budget (or its own budget, if less)
# The budgets are sized for the GPU machine (16 cores); the CPU rehearsal's many process start-ups on a small,
# shared machine take longer, so its timeouts are this many times the budget (the total budget stays).
REHEARSAL_TIMEOUT_FACTOR = 2
KILL_GRACE_S = 5


class Stopped(Exception):
    """A signal asked the whole run to stop."""


def skip_reason(check: Check, cuda: bool, capability: tuple[int, int] | None) -> str:
    """Why `check` cannot run here ('' if it can)."""
    if check.not_yet:
        return check.not_yet
    if not cuda and not check.rehearsal:
        return "needs CUDA: no CPU equivalent to rehearse"
    if "sm90" in check.needs and (capability is None or capability < (9, 0)):
        return "needs sm90 (H100+) for float8 matmuls"
    return ""


def record_for(check: Check, status: str = "pending", reason: str = "") -> dict:
    return {
        "name": check.name,
        "shows": check.shows,
        "budget_s": check.budget_s,
        "status": status,
        "reason": reason,
        "seconds": 0.0,
        "figures": {},
        "comparisons": [],
        "notes": [],
        "not_applicable": {},
        "claims": [],
    }


def _stop_on_signal(signum, _frame):
    raise Stopped(f"the gpu check was stopped by signal {signum} while this check ran")


def _kill(process: subprocess.Popen) -> None:
    """The check's whole process group (the trainer and the drivers it started, compile workers too)."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _read_result(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _wait(process: subprocess.Popen, timeout_s: float) -> tuple[str, str, bool]:
    """(status, reason, stopped): status '' when the process ended by itself."""
    try:
        process.wait(timeout=timeout_s)
        return "", "", False
    except subprocess.TimeoutExpired:
        return "timeout", f"timed out after {timeout_s:.0f} s", False
    except (Stopped, KeyboardInterrupt) as stop:
        return "timeout", str(stop) or "the gpu check was stopped (Ctrl-C) while this check ran", True
    finally:
        _kill(process)


def run_one(check: Check, cuda: bool, work: Path, timeout_s: float) -> tuple[dict, bool]:
    """Run one check's process. Returns its record (status, reason, seconds, figures, comparisons, notes) and
    whether a signal stopped the whole run meanwhile."""
    shutil.rmtree(work, ignore_errors=True)  # an earlier run's folders (titan-train appends to metrics.jsonl)
    work.mkdir(parents=True)
    result_path, log_path = work / "result.json", work / "child.log"
    argv = [sys.executable, "-m", "gpu_checks.child", check.target, "--result", str(result_path), "--work", str(work),
            "--timeout-s", f"{timeout_s:.0f}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(TOOLS), os.environ.get("PYTHONPATH")) if p)}
    start = time.monotonic()
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [*argv, *([] if cuda else ["--cpu"])], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
            start_new_session=True, preexec_fn=die_with_parent,
        )  # fmt: skip
        status, reason, stopped = _wait(process, timeout_s)
    record = record_for(check)
    record["seconds"] = round(time.monotonic() - start, 1)
    result = _read_result(result_path)
    for key in ("figures", "comparisons", "notes", "not_applicable"):
        record[key] = result.get(key, record[key])
    if not status:
        status = result.get("status", "fail")
        reason = result["reason"] if "status" in result else f"crashed: exit code {process.returncode}"
    if status != "pass":
        record["output_tail"] = tail(log_path.read_text(errors="replace"))
    record["status"], record["reason"] = status, reason
    return apply_claims(record, check.claims, cuda), stopped


STOPPED = "not run: the gpu check was stopped before this check"


def budget_reason(check: Check, left: float, budget_s: float) -> str:
    """Why `check` does not fit in the `left` seconds of the total budget ('' if it fits)."""
    needed = check.estimate_s or min(MIN_START_S, check.budget_s)
    if left >= needed:
        return ""
    return (f"budget: the total budget ({budget_s:.0f} s) was spent down to {max(left, 0):.0f} s, under its "
            f"estimated {needed} s")  # fmt: skip


def run_checks(
    checks: tuple[Check, ...],
    cuda: bool,
    capability: tuple[int, int] | None,
    work: Path,
    budget_s: float,
    write: Callable[[list[dict], bool], None],
) -> list[dict]:
    """Every check in order within `budget_s`; `write(records, complete)` after each change. A signal that
    stops the run marks the running check a timeout and the rest skipped, and the results are still written."""
    records = [record_for(c) for c in checks]
    previous = signal.signal(signal.SIGTERM, _stop_on_signal)
    start, stopped = time.monotonic(), False
    try:
        for index, check in enumerate(checks):
            left = budget_s - (time.monotonic() - start)
            reason = STOPPED if stopped else skip_reason(check, cuda, capability)
            if not reason:
                reason = budget_reason(check, left, budget_s)
            if reason:
                records[index] = record_for(check, "skip", reason)
                print(f"[gpu_check] {check.name}: skip {reason}", flush=True)
                continue
            records[index] = record_for(check, "running")
            write(records, False)
            timeout = min(check.budget_s * (1 if cuda else REHEARSAL_TIMEOUT_FACTOR), left)
            print(f"[gpu_check] {check.name}: running (at most {timeout:.0f} s)", flush=True)
            records[index], stopped = run_one(check, cuda, work / check.name, timeout)
            first_line = records[index]["reason"].split("\n")[0]
            print(f"[gpu_check] {check.name}: {records[index]['status']} {first_line}".rstrip(), flush=True)
            write(records, False)
    except (Stopped, KeyboardInterrupt):
        records = [r if r["status"] not in ("pending", "running") else {**r, "status": "skip", "reason": STOPPED}
                   for r in records]  # fmt: skip
    finally:
        signal.signal(signal.SIGTERM, previous)
    write(records, True)
    return records
