"""A forced collective mismatch through the trainer's own loop: the run fails within the train timeout and
the flight recorder, dumped by the trainer, names the mismatching collective."""

import time

from launch_helpers import run_script
from titan_debug.flight_recorder_summary import summarize_flight_recorder

TIMEOUT_S = 5


def test_mismatched_collective_fails_fast_and_dumps_the_flight_recorder(tmp_path):
    options = ["--model.flavor", "tiny", "--training.seq_len", "64", "--training.local_batch_size", "2",
               "--training.steps", "5", "--comm.train_timeout_seconds", str(TIMEOUT_S), "--job.dump_folder",
               str(tmp_path)]  # fmt: skip
    start = time.monotonic()
    proc = run_script("comm_mismatch_driver.py", options, nproc=2, timeout=300)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert elapsed < 120, elapsed  # a hang would be stopped by the 300 s test timeout instead
    assert sorted(p.name for p in (tmp_path / "comm_traces").iterdir()) == ["rank_0", "rank_1"]
    summary = summarize_flight_recorder(tmp_path)
    assert "MISMATCH" in summary and "rank 1 all_reduce in [7]" in summary, summary
