"""Launch a torchft job on this host as users launch one: torchft's lighthouse, then one torchrun per replica
group (each its own --standalone rendezvous), optionally killing (-9) or stopping (SIGSTOP) a rank of one group
once that group has logged a given step. Each group runs ft_driver.py, which saves the group's final weights to
<dump>.pt."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fault_injection import TORCHRUN, logged_steps, worker_pid
from forked_ranks import free_port
from launch_helpers import ROOT, _env

DRIVER = Path(__file__).resolve().parent / "ft_driver.py"
JOIN_TIMEOUT_S = 10  # the lighthouse's join_timeout_ms, in seconds


def start_lighthouse(log: Path, min_replicas: int = 1) -> tuple[subprocess.Popen, str]:
    """torchft_lighthouse on a free port: a quorum needs `min_replicas` groups (1: survivors go on alone); a
    group silent for 1 s is dead; a quorum waits up to JOIN_TIMEOUT_S for a heartbeating group that has not joined (a
    restarted one building its model). A port found free can be taken before the lighthouse binds it (it binds
    [::], where other processes' servers listen): then another."""
    binary = shutil.which("torchft_lighthouse") or str(Path(sys.executable).parent / "torchft_lighthouse")
    for _ in range(5):
        port = free_port()
        cmd = [binary, "--min_replicas", str(min_replicas), "--bind", f"[::]:{port}",
               "--join_timeout_ms", str(JOIN_TIMEOUT_S * 1000), "--heartbeat_timeout_ms", "1000",
               "--quorum_tick_ms", "50"]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=1)  # exits at once when the port is taken
        except subprocess.TimeoutExpired:
            return proc, f"http://localhost:{port}"
    raise RuntimeError(f"torchft_lighthouse did not start: {log.read_text()[-2000:]}")


@dataclass
class Group:
    replica_id: int
    dump: Path
    proc: subprocess.Popen
    log: Path
    seen: dict[int, float] = field(default_factory=dict)  # step -> time.monotonic() the launcher first saw it logged
    signalled_at: float | None = None  # when the launcher sent `sig` to a rank of this group

    @property
    def output(self) -> str:
        return self.log.read_text()


def start_group(replica_id: int, groups: int, args: list[str], root: Path, lighthouse: str, nproc: int = 2,
                max_restarts: int = 0, step_seconds: float = 0.0,
                pause_before_quorum: bool = False) -> Group:  # fmt: skip
    dump = root / f"group{replica_id}"
    log = root / f"group{replica_id}.log"
    cmd = [sys.executable, str(TORCHRUN), "--standalone", f"--nproc_per_node={nproc}",
           f"--max-restarts={max_restarts}", "--monitor-interval=0.2", str(DRIVER), f"{dump}.pt", *args,
           "--job.dump_folder", str(dump), "--fault_tolerance.enable", "true",
           "--fault_tolerance.group_size", str(groups), "--fault_tolerance.replica_id", str(replica_id)]  # fmt: skip
    env = {**_env(), "TORCHFT_LIGHTHOUSE": lighthouse, "TITAN_TEST_STEP_SECONDS": str(step_seconds),
           "TITAN_TEST_PAUSE_BEFORE_QUORUM": "1" if pause_before_quorum else "0"}  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    return Group(replica_id, dump, proc, log)


def run_groups(args: list[str], root: Path, groups: int = 2, kill: tuple[int, int, int] | None = None,
               timeout: float = 300, step_seconds: float = 0.0, nproc: int = 2,
               min_replicas: int = 1, sig: int = signal.SIGKILL,
               pause_before_quorum: bool = False) -> list[Group]:  # fmt: skip
    """Run `groups` replica groups of `nproc` ranks to the end (the lighthouse's quorum: `min_replicas`).
    `kill`: (group, rank, step): send `sig` (kill -9, or SIGSTOP: a hung rank) to that rank of that group once
    the group has logged that step, once; that group may restart once, the others never. `step_seconds`: added
    to every step (ft_driver.py), after its quorum or (`pause_before_quorum`) before it. Each group's `seen`
    says when its steps were logged, `signalled_at` when `sig` was sent."""
    root.mkdir(parents=True, exist_ok=True)
    lighthouse, address = start_lighthouse(root / "lighthouse.log", min_replicas)
    launched = [
        start_group(
            g,
            groups,
            args,
            root,
            address,
            max_restarts=1 if kill and kill[0] == g else 0,
            step_seconds=step_seconds,
            nproc=nproc,
            pause_before_quorum=pause_before_quorum,
        )  # fmt: skip
        for g in range(groups)
    ]
    deadline = time.monotonic() + timeout
    signalled = None
    try:
        while any(g.proc.poll() is None for g in launched) and time.monotonic() < deadline:
            now = time.monotonic()
            for group in launched:
                for step in logged_steps(group.dump):
                    group.seen.setdefault(step, now)
            if kill is not None:
                victim = launched[kill[0]]
                pid = worker_pid(victim.proc.pid, kill[1]) if kill[2] in victim.seen else None
                if pid is not None:
                    os.kill(pid, sig)
                    victim.signalled_at, kill, signalled = time.monotonic(), None, pid
            time.sleep(0.02)
    finally:
        for proc in [g.proc for g in launched] + [lighthouse]:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if signalled is not None and sig != signal.SIGKILL:
            # torchrun starts each worker in a session of its own: a stopped one outlives a torchrun killed here
            with contextlib.suppress(ProcessLookupError):
                os.kill(signalled, signal.SIGKILL)
    assert kill is None, f"never killed: the group did not log the step {kill}"
    return launched
