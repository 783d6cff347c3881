"""The forking launcher the integration cases use: a failing rank stops the others and gives its exit code, a
rank killed by a signal is started again once (with a warning), a second crash fails."""

import sys
import time

import pytest

from launch_helpers import run_ranks

# rank 1 fails as `FAILURE` says (`exit`: status 3; `abort`: SIGABRT, once per marker file when `once` is
# given); rank 0 waits for a minute unless stopped.
SCRIPT = """
import os, sys, time
failure, marker = sys.argv[1], sys.argv[2]
if os.environ["RANK"] == "1":
    if failure == "exit":
        sys.exit(3)
    if not os.path.exists(marker):
        if failure == "abort_once":
            open(marker, "w").close()
        os.abort()
    print("rank 1 done")
else:
    time.sleep(0 if failure == "abort_once" else 60)
"""


def launch(tmp_path, failure: str):
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    return run_ranks([sys.executable, str(script), failure, str(tmp_path / "marker")], nproc=2, timeout=120)


def test_a_failing_rank_stops_the_others_and_gives_its_code(tmp_path):
    start = time.monotonic()
    proc = launch(tmp_path, "exit")
    assert proc.returncode == 3
    assert time.monotonic() - start < 30  # rank 0 was stopped, not waited for


def test_a_rank_killed_by_a_signal_once_is_started_again_with_a_warning(tmp_path):
    with pytest.warns(RuntimeWarning, match="died by signal 6; started again"):
        proc = launch(tmp_path, "abort_once")
    assert proc.returncode == 0 and "rank 1 done" in proc.stdout


def test_a_second_crash_fails(tmp_path):
    with pytest.warns(RuntimeWarning, match="died by signal 6"):
        proc = launch(tmp_path, "abort")
    assert proc.returncode == -6
