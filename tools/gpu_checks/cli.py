"""The command line of `python tools/gpu_check.py` (and `nox -s gpu_check`)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gpu_checks import ROOT
from gpu_checks.checks import PRIORITY, describe, select
from gpu_checks.device import cpu_device, cuda_device, results_stem, versions
from gpu_checks.history import claims_table, history_table
from gpu_checks.results import Results
from gpu_checks.runner import run_checks

NO_CUDA = "no CUDA device here: nothing run (run it on a GPU machine, or rehearse with --rehearse-cpu --out DIR)"
EPILOG = """examples:
  python tools/gpu_check.py                      every check, results in gpu_results/<date>-<device>.{json,md}
  python tools/gpu_check.py --only train_debug memory_1b --budget-seconds 300
  python tools/gpu_check.py --list               what it runs, in order, with budgets, needs and claims
  python tools/gpu_check.py --rehearse-cpu --out /tmp/rehearsal   the CPU equivalents, tiny sizes
  python tools/gpu_check.py --history            which checks have run on a GPU (from gpu_results/)
  python tools/gpu_check.py --claims-table       each claim judged on the newest GPU figures (from gpu_results/)

exit codes: 0 every check that ran passed (or, without CUDA, nothing to run), 1 a check failed (a claim missed
its bound, or the check itself failed) or timed out, 2 a usage mistake."""
DEFAULT_BUDGET_S = 540  # nine minutes: a lent GPU's quarter hour, less its start-up and the copies


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu_check",
        description="Titan's checks that need a GPU, within a time budget; results in --out as json and markdown.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--list", action="store_true", help="print the checks and exit")
    p.add_argument("--history", action="store_true", help="which checks have run on a GPU, from --out's results")
    p.add_argument("--claims-table", action="store_true",
                   help="each check's claims judged on the newest GPU run's figures, from --out's results")  # fmt: skip
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these checks")
    p.add_argument("--out", type=Path, help="results directory (default: gpu_results/; needed with --rehearse-cpu)")
    p.add_argument("--work", type=Path, help="logs and run folders (default: outputs/gpu_check/<date>-<device>)")
    p.add_argument("--budget-seconds", "--budget-s", dest="budget_s", type=float, default=DEFAULT_BUDGET_S,
                   help=f"total seconds for all checks; a check whose estimate does not fit in what is left is "
                   f"skipped (default {DEFAULT_BUDGET_S})")  # fmt: skip
    p.add_argument("--rehearse-cpu", action="store_true", help="run the CPU equivalents at tiny sizes")
    return p


def print_list(checks) -> None:
    print(f"In the order they run: the headline checks first ({', '.join(PRIORITY)}), then the rest; a check "
          "whose estimate does not fit in what is left of the budget is skipped. A claim missed on a GPU fails "
          "its check.")  # fmt: skip
    for number, check in enumerate(checks, 1):
        print(f"{number}. {describe(check)}")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        checks = select(args.only)
    except ValueError as error:
        print(f"gpu_check: {error}", file=sys.stderr)
        return 2
    if args.list:
        print_list(checks)
        return 0
    if args.history:
        print(history_table(args.out or ROOT / "gpu_results"))
        return 0
    if args.claims_table:
        print(claims_table(args.out or ROOT / "gpu_results"))
        return 0
    if args.rehearse_cpu:
        if args.out is None:
            print("gpu_check: --rehearse-cpu needs --out DIR (a rehearsal's results stay out of gpu_results/)",
                  file=sys.stderr)  # fmt: skip
            return 2
        return run(checks, False, cpu_device(), args)
    device = cuda_device()
    if device is None:
        print_list(checks)
        print(NO_CUDA)
        return 0
    return run(checks, True, device, args)


def run(checks, cuda: bool, device: dict, args: argparse.Namespace) -> int:
    out = args.out or ROOT / "gpu_results"
    stem = results_stem(out, time.strftime("%Y-%m-%d"), device, cuda)
    results = Results(out, stem, "gpu" if cuda else "cpu-rehearsal", device, versions(), args.budget_s)
    work = args.work or ROOT / "outputs" / "gpu_check" / stem
    capability = tuple(device["capability"]) if cuda else None
    print(f"[gpu_check] {len(checks)} check(s) on {device['name']}; results: {results.json_path}", flush=True)
    records = run_checks(checks, cuda, capability, work, args.budget_s, results.write)
    print(results.md_path.read_text())
    print(f"results: {results.json_path} and {results.md_path}; logs: {work}")
    return 0 if all(r["status"] in ("pass", "skip") for r in records) else 1
