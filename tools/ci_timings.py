"""The timing report at the end of every CI run: each nox session's wall time, then the slowest test cases.

    python tools/ci_timings.py FOLDER [--slowest 25]

FOLDER is what the noxfile writes where TITAN_CI_TIMINGS points: `sessions.tsv` (session, seconds, outcome),
`lanes.tsv` (the same of each lane of sessions the default run runs at once: their sessions' sum counts the time
they overlap twice) and one JUnit XML report per pytest run (every case's setup + call + teardown time). Printed,
never asserted: it is there so a suite's growth is seen in the log of the run that grew it. Standard library only
(.ci/run calls it with whichever python3 it finds).
"""

import argparse
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path


def session_times(folder: Path, file: str = "sessions.tsv") -> list[tuple[str, float, str]]:
    path = folder / file
    if not path.exists():
        return []
    rows = [line.split("\t") for line in path.read_text().splitlines() if line.count("\t") == 2]
    return [(name, float(seconds), outcome) for name, seconds, outcome in rows]


def case_times(folder: Path) -> list[tuple[float, str, str]]:
    """(seconds, session, test id) for every case of every report in `folder`."""
    cases = []
    for report in sorted(folder.glob("*.xml")):
        try:
            root = ElementTree.parse(report).getroot()
        except ElementTree.ParseError:  # a run killed while writing it
            continue
        for suite in root.iter("testsuite"):
            for case in suite.iter("testcase"):
                test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
                cases.append((float(case.get("time") or 0.0), suite.get("name", report.stem), test_id))
    return cases


def report(folder: Path, slowest: int) -> str:
    lines = ["", "=== timing report: nox sessions (wall time) ==="]
    sessions = session_times(folder)
    for name, seconds, outcome in sessions:
        lines.append(f"{seconds:8.1f} s  {name}  ({outcome})")
    lines.append(f"{sum(s for _, s, _ in sessions):8.1f} s  all sessions")
    lanes = session_times(folder, "lanes.tsv")
    if lanes:
        lines.append("=== lanes: sessions run one after another, the lanes at once (wall time) ===")
        lines += [f"{seconds:8.1f} s  {name}  ({outcome})" for name, seconds, outcome in lanes]
    cases = case_times(folder)
    lines.append(f"=== the {min(slowest, len(cases))} slowest of {len(cases)} test cases (setup + call + teardown) ===")
    for seconds, suite, test_id in sorted(cases, reverse=True)[:slowest]:
        lines.append(f"{seconds:8.1f} s  [{suite}] {test_id}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--slowest", type=int, default=25)
    args = parser.parse_args(argv)
    print(report(args.folder, args.slowest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
