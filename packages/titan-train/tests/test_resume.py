"""A resume reports the checkpoint it continues from and the steps the previous attempt loses."""

import json
import logging

from titan_train.run.resume import last_logged_step, log_resume
from titan_train.run.run_record import RunRecord


def write_rows(folder, rows):
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 9, "lo')


def test_steps_lost_count_the_previous_attempts_of_this_run_only(tmp_path, caplog):
    write_rows(tmp_path, [
        {"step": 7, "run_id": "old", "restart": 0},  # another run in the same folder
        {"step": 3, "run_id": "r", "restart": 0},
        {"step": 6, "run_id": "r", "restart": 0},
        {"step": 5, "run_id": "r", "restart": 1},
    ])  # fmt: skip
    run = RunRecord("r", 2)
    assert last_logged_step(tmp_path, run) == 6
    with caplog.at_level(logging.INFO, logger="titan"):
        log_resume(tmp_path / "checkpoint" / "step-4", 4, tmp_path, run)
    assert f"resuming run r (restart 2) from {tmp_path / 'checkpoint' / 'step-4'}, step 4" in caplog.text
    assert "logged step 6: 2 step(s) lost" in caplog.text


def test_no_previous_rows_says_so(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="titan"):
        log_resume(tmp_path / "step-4", 4, tmp_path, RunRecord("r", 1))
    assert "the previous attempt logged no step" in caplog.text
