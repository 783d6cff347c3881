"""tools/ci_timings.py, the report at the end of every .ci/run: each session's time from sessions.tsv, each lane's
from lanes.tsv, then the slowest cases from the JUnit reports, slowest first, a truncated report skipped."""

import subprocess
import sys

from launch_helpers import ROOT

TOOL = str(ROOT / "tools" / "ci_timings.py")
JUNIT = """<testsuites><testsuite name="{suite}">
<testcase classname="tests.test_a" name="test_fast" time="0.5"/>
<testcase classname="tests.test_a" name="test_slow" time="{slow}"/>
</testsuite></testsuites>"""


def test_the_report_names_each_session_and_the_slowest_cases_first(tmp_path):
    (tmp_path / "sessions.tsv").write_text("lint\t1.5\tpassed\nintegration\t100.0\tfailed\n")
    (tmp_path / "lanes.tsv").write_text("lane 1: lint, integration\t101.6\tfailed\n")
    (tmp_path / "a.xml").write_text(JUNIT.format(suite="integration", slow="42.0"))
    (tmp_path / "b.xml").write_text(JUNIT.format(suite="tests", slow="7.0"))
    (tmp_path / "c.xml").write_text("<testsuites><testsuite")  # a run killed while writing it
    out = subprocess.run([sys.executable, TOOL, str(tmp_path), "--slowest", "2"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "     1.5 s  lint  (passed)" in lines and "   100.0 s  integration  (failed)" in lines
    assert "   101.5 s  all sessions" in lines
    lanes = lines.index("=== lanes: sessions run one after another, the lanes at once (wall time) ===")
    assert lines[lanes + 1] == "   101.6 s  lane 1: lint, integration  (failed)"
    assert "=== the 2 slowest of 4 test cases (setup + call + teardown) ===" in lines
    assert lines[-2:] == [
        "    42.0 s  [integration] tests.test_a::test_slow",
        "     7.0 s  [tests] tests.test_a::test_slow",
    ]
