"""tools/memory_report.py shows FSDP's 1/N: per-rank bytes on 2 ranks are half of one process's."""

import re
import subprocess
import sys

from launch_helpers import ROOT, _env

ARGS = ["--config", str(ROOT / "configs" / "debug_model.toml"), "--model.flavor", "tiny",
        "--training.seq_len", "32", "--training.local_batch_size", "2"]  # fmt: skip


def report(tmp_path, nproc: int) -> list[list[float]]:
    tool = str(ROOT / "tools" / "memory_report.py")
    launch = [sys.executable, tool] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", tool]  # fmt: skip
    proc = subprocess.run([*launch, *ARGS, "--job.dump_folder", str(tmp_path)], capture_output=True, text=True,
                          env=_env(), timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if re.match(r"^\s+\d+\s+\d", line)]
    assert len(rows) == nproc, proc.stdout
    return [[float(x) for x in row[1:]] for row in rows]


def test_fsdp_halves_per_rank_state(tmp_path):
    (single,) = report(tmp_path, 1)
    for rank_row in report(tmp_path, 2):
        for whole, shard in zip(single, rank_row, strict=True):
            assert abs(shard - whole / 2) <= 0.01 * whole + 0.01, (single, rank_row)
