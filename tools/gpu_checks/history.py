"""Which checks have run on a GPU, read from the committed results (`python tools/gpu_check.py --history`), and
which claims their figures have been judged on (`--claims-table`): the tables docs/gpu-check.md is kept
from. CPU rehearsals do not count."""

from __future__ import annotations

import json
from pathlib import Path

from gpu_checks.checks import CHECKS
from gpu_checks.claims import NOT_MEASURED, flat_figures, judge


def gpu_runs(folder: Path) -> list[dict]:
    """Every GPU results document in `folder`, oldest first (files that do not parse are left out)."""
    documents = []
    for path in sorted(folder.glob("*.json")):
        try:
            document = json.loads(path.read_text())
        except ValueError:
            continue
        if document.get("kind") == "gpu":
            documents.append({**document, "file": path.name})
    return sorted(documents, key=lambda d: d.get("started", ""))


def latest_by_check(documents: list[dict]) -> dict[str, dict]:
    """Per check name, its record in the newest run that ran it (a skip does not count as a run)."""
    latest = {}
    for document in documents:
        for record in document["checks"]:
            if record["status"] in ("pass", "fail", "timeout"):
                latest[record["name"]] = {**record, "device": document["device"]["name"], "file": document["file"]}
    return latest


def history_table(folder: Path) -> str:
    latest = latest_by_check(gpu_runs(folder))
    lines = ["| check | on a GPU | status | results |", "|---|---|---|---|"]
    for check in CHECKS:
        record = latest.get(check.name)
        if record is None:
            lines.append(f"| {check.name} | not yet | - | - |")
        else:
            lines.append(f"| {check.name} | {record['device']} | {record['status']} | {record['file']} |")
    return "\n".join(lines)


WAITS = "waits for a GPU"


def _figures_cell(figures: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.3g}" for name, value in figures.items()).replace("|", "\\|")


def claims_table(folder: Path) -> str:
    """Per check, in the order they run, each claim judged on the figures of the newest GPU run of the check:
    its verdict, the figures and the file; or that it waits for a GPU (no run, or none recorded its figures)."""
    latest = latest_by_check(gpu_runs(folder))
    lines = ["| check | claim | bound | on a GPU | figures | results |", "|---|---|---|---|---|---|"]
    for check in CHECKS:
        record = latest.get(check.name)
        if not check.claims:
            lines.append(f"| {check.name} | - | - | {check.not_yet or 'claims nothing'} | - | - |")
        for claim in check.claims:
            verdict = judge(claim, flat_figures(record)) if record else None
            if verdict is None or verdict["verdict"] == NOT_MEASURED:
                lines.append(f"| {check.name} | {claim.name} | {claim.bound} | {WAITS} | - | - |")
                continue
            lines.append(f"| {check.name} | {claim.name} | {claim.bound} | {verdict['verdict']} | "
                         f"{_figures_cell(verdict['figures'])} | {record['file']} |")  # fmt: skip
    return "\n".join(lines)
