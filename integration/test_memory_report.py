"""tools/memory_report.py shows FSDP's 1/N: per-rank bytes on 2 ranks are half of one process's."""

import re
import sys

from launch_helpers import ROOT, run_ranks

ARGS = ["--config", str(ROOT / "configs" / "debug_model.toml"), "--model.flavor", "tiny",
        "--training.seq_len", "32", "--training.local_batch_size", "2"]  # fmt: skip


def report(tmp_path, nproc: int) -> list[list[float]]:
    tool = str(ROOT / "tools" / "memory_report.py")
    command = [sys.executable, tool, *ARGS, "--job.dump_folder", str(tmp_path)]
    proc = run_ranks(command, nproc if nproc > 1 else None, 300)  # nproc ranks forked with torchrun's variables
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if re.match(r"^\s+\d+\s+\d", line)]
    assert len(rows) == nproc, proc.stdout
    return [[float(x) for x in row[1:]] for row in rows]


def test_fsdp_halves_per_rank_state(tmp_path):
    (single,) = report(tmp_path, 1)
    for rank_row in report(tmp_path, 2):
        for whole, shard in zip(single, rank_row, strict=True):
            assert abs(shard - whole / 2) <= 0.01 * whole + 0.01, (single, rank_row)
