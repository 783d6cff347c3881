"""A node lost and back under `torchrun --nnodes 1:2` (c10d rendezvous): two torchrun agents on the loopback
address, two "nodes" of 2 ranks. Node B is killed (its agent and workers, -9, as a machine that dies): the
job re-forms on node A alone, resumes from the latest checkpoint on 2 ranks with the same global batch
(gradient accumulation 2 instead of 1), and when B's agent starts again the next restart uses both nodes. The
losses equal the uninterrupted 4-rank run's within fp32 tolerance (the accumulation sums in another order)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fault_injection import children, logged_steps
from forked_ranks import free_port
from launch_helpers import DEBUG_RECIPE, ROOT, _env, read_metrics, run_titan

STEPS = 120
ARGS = [
    "--config", str(DEBUG_RECIPE), "--model.flavor", "tiny", "--training.seq_len", "32",
    "--training.local_batch_size", "2", "--training.global_batch_size", "8", "--training.deterministic", "true",
    "--metrics.log_freq", "1", "--training.steps", str(STEPS), "--lr_scheduler.warmup_steps", "2",
    "--lr_scheduler.decay_type", "constant", "--validation.enable", "false", "--checkpoint.enable", "true",
    "--checkpoint.interval", "4", "--checkpoint.keep_latest_k", "0", "--comm.train_timeout_seconds", "5",
]  # fmt: skip


def start_agent(port: int, host: bool, dump: Path, log: Path) -> subprocess.Popen:
    """One node's torchrun: 1 to 2 nodes of 2 ranks; `host`: this agent serves the rendezvous store (on a real
    cluster, the agent on the endpoint's machine). A node is dead after 10 s without a heartbeat: shorter, and
    a busy agent on 2 shared cores misses beats, is taken for dead, and a joining node forms a job of its own."""
    rdzv = f"join_timeout=120,last_call_timeout=3,keep_alive_interval=2,keep_alive_max_attempt=5,is_host={host}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc_per_node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "elastic-test",
           "--rdzv-conf", rdzv, "--max-restarts", "3", "--monitor-interval", "0.2",
           "-m", "titan_train", *ARGS, "--job.dump_folder", str(dump)]  # fmt: skip
    # torch 2.13 shares the rendezvous store with the workers by default, and then a node that joins a running
    # job deadlocks the next round: the rank-0 agent, which built the workers' store info in an earlier round,
    # does not publish it for this one, and the new node waits for it (dynamic_rendezvous.py, next_rendezvous).
    # Unshared, rank 0 publishes it every round (and the workers' group gets a store of its own).
    env = {**_env(), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip


def kill_node(agent: subprocess.Popen) -> None:
    """The agent and its workers, -9 (the workers first, or the agent's death would leave them running)."""
    for pid in children(agent.pid):
        os.kill(pid, signal.SIGKILL)
    agent.kill()
    agent.wait()


def wait_for(condition, what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.05)


@pytest.mark.slow  # about two minutes, mostly waiting: three rendezvous and two restarts
def test_a_lost_node_reforms_the_job_on_the_other_and_a_returning_node_rejoins(tmp_path):
    reference = tmp_path / "straight"
    proc = run_titan([*ARGS, "--job.dump_folder", str(reference)], nproc=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dump, port = tmp_path / "elastic", free_port()
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    a = start_agent(port, True, dump, a_log)
    b = start_agent(port, False, dump, b_log)
    agents = [a, b]
    try:
        wait_for(lambda: 6 in logged_steps(dump), "step 6 on both nodes")
        kill_node(b)
        # Node A restarts alone: 2 ranks, the global batch kept by accumulating 2 micro-batches.
        wait_for(lambda: "layout world 2" in a_log.read_text(), "the job to re-form on node A")
        alone_from = max(logged_steps(dump))
        wait_for(lambda: max(logged_steps(dump)) >= alone_from + 3, "steps on node A alone")
        b = start_agent(port, False, dump, tmp_path / "b2.log")
        agents.append(b)
        for agent in (a, b):
            agent.wait(timeout=300)
    finally:
        for agent in agents:
            if agent.poll() is None:
                kill_node(agent)
    log = a_log.read_text()
    assert a.returncode == 0 and b.returncode == 0, log[-5000:]
    starts = [line for line in log.splitlines() if "layout world" in line]
    assert "world 4" in starts[0] and "gradient accumulation 1" in starts[0], starts
    assert any("world 2" in s and "gradient accumulation 2" in s for s in starts), starts
    assert "world 4" in starts[-1], starts  # the next restart after B came back used both nodes
    expected = {r["step"]: r["loss"] for r in read_metrics(reference)}
    got = {r["step"]: r["loss"] for r in read_metrics(dump)}  # a step trained again keeps its latest row
    assert sorted(got) == list(range(1, STEPS + 1))
    assert [got[s] for s in sorted(got)] == pytest.approx([expected[s] for s in sorted(got)], rel=1e-5)
