"""What a resume reports: the checkpoint it continues from and the steps the interrupted attempt had done
past it (lost, and trained again). The progress of the attempt is read from <dump_folder>/metrics.jsonl,
whose rows carry the run id and restart counter (run_record.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from titan_train.run.run_record import RunRecord

logger = logging.getLogger("titan")


def last_logged_step(dump_folder: str | Path, run: RunRecord) -> int | None:
    """The highest step an earlier start of `run` logged to metrics.jsonl (None if none did)."""
    path = Path(dump_folder) / "metrics.jsonl"
    if not path.is_file():
        return None
    last = None
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # the line a killed process was writing
        if row.get("run_id") == run.run_id and row.get("restart", 0) < run.restart and "step" in row:
            last = row["step"] if last is None else max(last, row["step"])
    return last


def log_resume(checkpoint: str | Path, step: int, dump_folder: str | Path, run: RunRecord | None) -> None:
    """Log what this start resumes from and how many steps the previous attempt loses (rank 0 has `run`)."""
    if run is None:
        return
    message = f"resuming run {run.run_id} (restart {run.restart}) from {checkpoint}, step {step}"
    last = last_logged_step(dump_folder, run)
    if last is None:
        logger.info(f"{message}; the previous attempt logged no step")
    else:
        lost = max(0, last - step)
        logger.info(
            f"{message}; the previous attempt had logged step {last}: {lost} step(s) lost "
            "(more if it stopped between logged steps; see metrics.log_freq)"
        )
