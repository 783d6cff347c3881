"""Compare the per-step loss of two runs and find the first step where they diverge.

Steps are matched by number. Step ``s`` diverges when ``|a - b| > atol + rtol * |b|`` (``numpy.isclose``'s
rule, with run b as the reference); a step where one run logged no finite loss (``null`` in the JSONL) and
the other did also diverges. A step logged twice (a resumed run) counts once, with its last value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class StepLoss:
    step: int
    a: float | None
    b: float | None
    diverged: bool

    @property
    def diff(self) -> float | None:
        return None if self.a is None or self.b is None else self.a - self.b


@dataclass
class Report:
    rtol: float
    atol: float
    steps: list[StepLoss] = field(default_factory=list)
    only_a: list[int] = field(default_factory=list)  # steps logged by run a only
    only_b: list[int] = field(default_factory=list)

    @property
    def first_divergence(self) -> int | None:
        return next((s.step for s in self.steps if s.diverged), None)

    def format(self) -> str:
        lines = [f"{'step':>6}  {'loss a':>12}  {'loss b':>12}  {'a - b':>12}"]
        for s in self.steps:
            mark = "  <- diverged" if s.diverged else ""
            lines.append(f"{s.step:>6}  {_fmt(s.a):>12}  {_fmt(s.b):>12}  {_fmt(s.diff, '+.3e'):>12}{mark}")
        if self.only_a or self.only_b:
            lines.append(f"steps only in a: {_steps(self.only_a)}; only in b: {_steps(self.only_b)}")
        tolerance = f"atol={self.atol:g} + rtol={self.rtol:g} * |b|"
        if not self.steps:
            lines.append("no step is logged by both runs")
        elif self.first_divergence is None:
            lines.append(f"all {len(self.steps)} common steps agree within {tolerance}")
        else:
            count = sum(s.diverged for s in self.steps)
            lines.append(f"first divergence at step {self.first_divergence} ({count} steps beyond {tolerance})")
        return "\n".join(lines)


def compare_losses(
    a_records: Iterable[Mapping[str, Any]], b_records: Iterable[Mapping[str, Any]], rtol: float, atol: float
) -> Report:
    """Match records by ``step`` and compare their ``loss``; records without a step are ignored."""
    a, b = _losses(a_records), _losses(b_records)
    report = Report(rtol=rtol, atol=atol)
    for step in sorted(a.keys() & b.keys()):
        x, y = a[step], b[step]
        if x is None or y is None:
            diverged = (x is None) != (y is None)
        else:
            diverged = abs(x - y) > atol + rtol * abs(y)
        report.steps.append(StepLoss(step, x, y, diverged))
    report.only_a = sorted(a.keys() - b.keys())
    report.only_b = sorted(b.keys() - a.keys())
    return report


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics JSONL file (or of ``<path>/metrics.jsonl`` for a dump folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    records, bad = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            bad.append(number)  # a run killed mid-write leaves a partial line (MetricsLogger starts a new one)
    if bad and not records:
        raise ValueError(f"{path} holds no JSON lines (line {bad[0]} is not JSON); expected a metrics.jsonl")
    return records


def _losses(records: Iterable[Mapping[str, Any]]) -> dict[int, float | None]:
    losses: dict[int, float | None] = {}
    for record in records:
        if record.get("step") is None:
            continue
        loss = record.get("loss")
        losses[int(record["step"])] = float(loss) if loss is not None and math.isfinite(float(loss)) else None
    return losses


def _fmt(value: float | None, spec: str = ".6f") -> str:
    return "n/a" if value is None else format(value, spec)


def _steps(steps: list[int]) -> str:
    if not steps:
        return "none"
    return ", ".join(map(str, steps[:10])) + (f" ... ({len(steps)} steps)" if len(steps) > 10 else "")
