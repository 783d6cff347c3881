"""Compare the loss curves of two runs; exit 1 at the first step where they diverge.

    python tools/loss_compare.py A B [--rtol 1e-5] [--atol 1e-8]

A and B are metrics.jsonl files or dump folders holding one. With --run they are commands instead, run one
after the other, each with `--job.dump_folder <temporary folder>` appended:

    python tools/loss_compare.py --run "titan-train --config configs/debug_model.toml" \\
        "torchrun --nproc_per_node 2 -m titan_train --config configs/debug_model.toml --training.seed 1"

Prints, per step logged by both, the two losses and their difference, then the first step where
|a - b| > atol + rtol * |b| (run B is the reference). Exit code: 0 agree, 1 diverge (or no common step),
2 bad arguments or a run that failed.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from titan_debug import compare_losses, read_metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="metrics.jsonl or dump folder of run A (with --run: a command)")
    parser.add_argument("b", help="metrics.jsonl or dump folder of run B, the reference (with --run: a command)")
    parser.add_argument("--run", action="store_true", help="A and B are titan-train commands to run")
    parser.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance (default 1e-5)")
    parser.add_argument("--atol", type=float, default=1e-8, help="absolute tolerance (default 1e-8)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="loss_compare_") as tmp:
        if args.run:
            sources = [_run(args.a, Path(tmp) / "a"), _run(args.b, Path(tmp) / "b")]
        else:
            sources = [Path(args.a), Path(args.b)]
        for source in sources:
            if not source.exists():
                parser.error(f"{source} does not exist")
        report = compare_losses(read_metrics(sources[0]), read_metrics(sources[1]), rtol=args.rtol, atol=args.atol)
    print(report.format())
    return 0 if report.steps and report.first_divergence is None else 1


def _run(command: str, dump_folder: Path) -> Path:
    argv = [*shlex.split(command), "--job.dump_folder", str(dump_folder)]
    print(f"$ {shlex.join(argv)}", flush=True)
    result = subprocess.run(argv)
    if result.returncode != 0:
        print(f"run failed with exit code {result.returncode}: {command}", file=sys.stderr)
        sys.exit(2)
    return dump_folder / "metrics.jsonl"


if __name__ == "__main__":
    sys.exit(main())
