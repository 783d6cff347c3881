"""The SLURM launch recipes of configs/slurm/, run with srun / sbatch / scontrol replaced by local stand-ins
(integration/slurm_standin/: every "node" is this machine): the batch script (one torchrun per node, rendezvous
on the first node) and the torchft variant (a lighthouse job and one job per replica group)."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fault_injection import children
from forked_ranks import free_port
from launch_helpers import DEBUG_RECIPE, ROOT, _env, read_metrics

SLURM = ROOT / "configs" / "slurm"
STANDIN = Path(__file__).resolve().parent / "slurm_standin"
TINY = [
    "--config", str(DEBUG_RECIPE), "--model.flavor", "tiny", "--training.seq_len", "32",
    "--training.local_batch_size", "2", "--training.steps", "3", "--metrics.log_freq", "1",
    "--validation.enable", "false",
]  # fmt: skip


def slurm_env(**values: str) -> dict:
    return {**_env(), "PATH": f"{STANDIN}:{os.environ['PATH']}", "GPUS_PER_NODE": "2", **values}


def descendants(pid: int) -> list[int]:
    found = children(pid)
    return found + [d for child in found for d in descendants(child)]


def test_the_batch_script_runs_one_torchrun_per_node_with_the_rendezvous_on_the_first(tmp_path):
    dump = tmp_path / "run"
    env = slurm_env(SLURM_JOB_ID="7", SLURM_NNODES="2", SLURM_JOB_NODELIST="127.0.0.1,127.0.0.1",
                    RDZV_PORT=str(free_port()))  # fmt: skip
    # What sbatch runs on the job's first node.
    proc = subprocess.run(["bash", str(SLURM / "titan.sbatch"), *TINY, "--job.dump_folder", str(dump)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    log = proc.stdout + proc.stderr
    # Two agents of 2 ranks formed one job of 4 (a rank per node would say world 2).
    assert "layout world 4 = dp_replicate 1 x dp_shard 4" in log, log[-4000:]
    assert [r["step"] for r in read_metrics(dump)] == [1, 2, 3]


def test_the_torchft_recipe_runs_a_lighthouse_job_and_one_job_per_replica_group(tmp_path):
    state, ft_dir = tmp_path / "slurm", tmp_path / "ft"
    env = slurm_env(FAKE_SLURM_STATE=str(state), FT_DIR=str(ft_dir), FT_GROUPS="2", NODES_PER_GROUP="1",
                    LIGHTHOUSE_PORT=str(free_port()), RDZV_PORT=str(free_port()), MIN_REPLICAS="2")  # fmt: skip
    submit = subprocess.run(["bash", str(SLURM / "ft_submit.sh"), *TINY], env=env, cwd=ROOT, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert submit.returncode == 0, submit.stderr
    lighthouse, *groups = submit.stdout.split()
    assert len(groups) == 2
    try:
        deadline = time.monotonic() + 300
        while not all((state / f"{job}.rc").exists() for job in groups):
            assert time.monotonic() < deadline, "the group jobs did not end"
            time.sleep(0.2)
    finally:
        for job in [lighthouse, *groups]:
            pid = int((state / f"{job}.pid").read_text())
            for p in descendants(pid):
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    for g, job in enumerate(groups):
        out = (ft_dir / f"group{g}-{job}.out").read_text()
        assert (state / f"{job}.rc").read_text().strip() == "0", out[-4000:]
        rows = read_metrics(ft_dir / f"group{g}")
        assert [(r["step"], r["replicas"]) for r in rows] == [(1, "2/2"), (2, "2/2"), (3, "2/2")], out[-3000:]
    assert (ft_dir / "lighthouse").read_text().startswith("http://")


@pytest.fixture(autouse=True)
def _slurm_standin_is_executable():
    assert all(os.access(STANDIN / tool, os.X_OK) for tool in ("srun", "sbatch", "scontrol"))
