"""Which checks have run on a GPU, read from the committed results (`python tools/gpu_check.py --history`):
the table docs/gpu-check.md's "what has run on a GPU" is kept from. CPU rehearsals do not count."""

from __future__ import annotations

import json
from pathlib import Path

from gpu_checks.checks import CHECKS


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
