"""Break a torchrun job the way production breaks it: kill -9 or SIGSTOP one worker once it has logged a
given step (read from <dump_folder>/metrics.jsonl), then let torchrun restart the group.

    python fault_injection.py --kill-rank 1 --after-step 5 --max-restarts 1 -- [titan-train options...]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from launch_helpers import ROOT, _env

TORCHRUN = Path(__file__).resolve().parent / "torchrun_test_grace.py"


def children(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def worker_pid(torchrun_pid: int, rank: int) -> int | None:
    """The pid of the torchrun worker whose environment says RANK=<rank> (of the current restart)."""
    for pid in children(torchrun_pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            return pid
    return None


def logged_steps(dump_folder: Path) -> list[int]:
    path = dump_folder / "metrics.jsonl"
    if not path.is_file():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            steps.append(json.loads(line)["step"])
        except (ValueError, KeyError):
            pass  # a line being written
    return steps


@dataclass
class Outcome:
    returncode: int
    output: str
    injected: bool
    seconds_from_injection_to_exit: float | None


def run_with_fault(
    args: list[str],
    dump_folder: Path,
    *,
    nproc: int = 2,
    max_restarts: int = 1,
    victim_rank: int = 1,
    after_step: int = 1,
    sig: int = signal.SIGKILL,
    when=None,
    timeout: float = 600,
    extra_torchrun: tuple[str, ...] = (),
) -> Outcome:
    """Run titan_train under torchrun and send `sig` to rank `victim_rank` once `after_step` is logged (and
    `when()` holds, if given), in the first attempt only. Returns the torchrun exit code and its output."""
    # torchrun, with a test-sized grace before it SIGKILLs a stopped worker (torchrun_test_grace.py)
    torchrun = [sys.executable, str(TORCHRUN), "--standalone", f"--nproc_per_node={nproc}",
                f"--max-restarts={max_restarts}", "--monitor-interval=0.2", *extra_torchrun]  # fmt: skip
    cmd = [*torchrun, "-m", "titan_train", *args]
    log = dump_folder.parent / f"{dump_folder.name}.torchrun.log"
    dump_folder.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=_env(), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        injected_at = None
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                if injected_at is None and after_step in logged_steps(dump_folder) and (when is None or when()):
                    pid = worker_pid(proc.pid, victim_rank)
                    if pid is not None:
                        os.kill(pid, sig)
                        injected_at = time.monotonic()
                time.sleep(0.02)
            exited = time.monotonic()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return Outcome(
        proc.returncode,
        log.read_text(),
        injected_at is not None,
        None if injected_at is None else exited - injected_at,
    )


if __name__ == "__main__":
    split = sys.argv.index("--")
    opts, trainer_args = sys.argv[1:split], sys.argv[split + 1 :]
    named = dict(zip(opts[::2], opts[1::2], strict=True))
    dump = Path(trainer_args[trainer_args.index("--job.dump_folder") + 1])
    result = run_with_fault(
        trainer_args,
        dump,
        victim_rank=int(named.get("--kill-rank", 1)),
        after_step=int(named.get("--after-step", 1)),
        max_restarts=int(named.get("--max-restarts", 1)),
        sig=getattr(signal, named.get("--signal", "SIGKILL")),
    )
    print(result.output[-6000:])
    print(f"returncode={result.returncode} injected={result.injected}")
