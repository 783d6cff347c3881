"""`titan-train plot DUMP_FOLDER [DUMP_FOLDER ...] [--out PNG]`: the metrics of runs, overlaid, as one PNG.

Three panels against the step: loss (validation_loss dashed in the same colour, where the rows have it),
tokens/s per device (tps) and peak memory (GiB). Each run is a line: a dump folder, or each run id within it
when several runs appended to its metrics.jsonl. A step logged again after a restart keeps the row of the
latest restart, as a resumed run supersedes what it repeats. Needs matplotlib (`pip install 'titan-train[plot]'`).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from titan_debug import read_metrics
from titan_train.cli.command import UsageError

PANELS = (("loss", "loss"), ("tps", "tokens/s per device"), ("memory", "peak memory (GiB)"))


@dataclass
class RunSeries:
    label: str
    rows: dict[int, dict] = field(default_factory=dict)
    """The row of each step (the latest restart's)."""

    def points(self, key: str) -> tuple[list[int], list[float]]:
        steps = [s for s in sorted(self.rows) if isinstance(self.rows[s].get(key), (int, float))]
        return steps, [float(self.rows[s][key]) for s in steps]


def read_runs(folder: str | Path) -> list[RunSeries]:
    """The runs of one dump folder, in the order they started."""
    folder = Path(folder)
    file = folder / "metrics.jsonl" if folder.is_dir() or not folder.suffix else folder
    if not file.is_file():
        raise UsageError(f"{file} does not exist; give a job.dump_folder that a run has logged metrics to")
    runs: dict[str, RunSeries] = {}
    restarts: dict[tuple[str, int], int] = {}
    for row in read_metrics(file):
        if not isinstance(row.get("step"), int):
            continue
        run_id = str(row.get("run_id", ""))
        series = runs.setdefault(run_id, RunSeries(run_id))
        restart = int(row.get("restart") or 0)
        if restart >= restarts.get((run_id, row["step"]), -1):
            series.rows[row["step"]] = row
            restarts[(run_id, row["step"])] = restart
    name = folder.name if folder.is_dir() else folder.parent.name
    for series in runs.values():
        series.label = f"{name} ({series.label})" if len(runs) > 1 and series.label else name
    return list(runs.values())


def plot_runs(folders: list[str | Path], out: str | Path):
    """Draw every run of `folders` and save the PNG at `out`; returns the matplotlib Figure."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError("titan-train plot needs matplotlib: pip install 'titan-train[plot]'") from None
    runs = [series for folder in folders for series in read_runs(folder)]
    figure = Figure(figsize=(6 * len(PANELS), 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(PANELS))
    for (key, title), ax in zip(PANELS, axes, strict=True):
        for index, series in enumerate(runs):
            colour = f"C{index % 10}"
            steps, values = series.points(key)
            if steps:
                ax.plot(steps, values, color=colour, label=series.label)
            if key == "loss":
                val_steps, val_values = series.points("validation_loss")
                if val_steps:
                    ax.plot(val_steps, val_values, color=colour, linestyle="--", marker=".",
                            label=f"{series.label} validation")  # fmt: skip
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize="small")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    return figure


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="titan-train plot",
        description="Loss (and validation loss), tokens/s and memory against steps, several runs overlaid, as a PNG.",
        epilog="example: titan-train plot outputs/run_a outputs/run_b --out compare.png",
    )
    parser.add_argument("dump_folders", nargs="+", help="job.dump_folder of each run (or its metrics.jsonl)")
    parser.add_argument("--out", help="the PNG to write (default: <first dump folder>/metrics.png)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse has printed the usage and the mistake on stderr
        return int(e.code or 0)
    first = Path(args.dump_folders[0])
    out = Path(args.out) if args.out else (first if first.is_dir() else first.parent) / "metrics.png"
    plot_runs(args.dump_folders, out)
    print(f"wrote {out}", file=sys.stderr)
    return 0
