"""The results files: `<stem>.json` (every figure, the versions, each check's status, reason and seconds) and
`<stem>.md` (the table a person reads, also printed). Both are rewritten after every check; `complete`
says whether the run got to the end."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

STATUSES = ("pass", "fail", "timeout", "skip")
MAX_FIGURES_IN_TABLE = 6


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


@dataclass
class Results:
    """One run's document; `write(records, complete)` rewrites both files."""

    out: Path
    stem: str
    kind: str  # "gpu" or "cpu-rehearsal"
    device: dict
    versions: dict
    budget_s: float
    started: str = field(default_factory=_now)
    start_time: float = field(default_factory=time.monotonic)

    @property
    def json_path(self) -> Path:
        return self.out / f"{self.stem}.json"

    @property
    def md_path(self) -> Path:
        return self.out / f"{self.stem}.md"

    def document(self, records: list[dict], complete: bool) -> dict:
        counts = {s: sum(r["status"] == s for r in records) for s in STATUSES}
        return {
            "schema": 1,
            "kind": self.kind,
            "date": self.stem[:10],
            "started": self.started,
            "updated": _now(),
            "complete": complete,
            "budget_s": self.budget_s,
            "elapsed_s": round(time.monotonic() - self.start_time, 1),
            "device": self.device,
            "versions": self.versions,
            "summary": counts,
            "checks": records,
        }

    def write(self, records: list[dict], complete: bool) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        document = self.document(records, complete)
        _replace(self.json_path, json.dumps(document, indent=1, default=str) + "\n")
        _replace(self.md_path, markdown(document))


def _replace(path: Path, text: str) -> None:
    """Write whole or not at all: a kill mid-write leaves the previous version."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    temporary.replace(path)


def format_value(value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower() if value is not None else "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def key_figures(record: dict) -> str:
    figures = record.get("figures", {})
    if "headline" in figures:
        return str(figures["headline"])
    shown = [f"{k} {format_value(v)}" for k, v in figures.items() if not isinstance(v, dict | list)]
    more = len(shown) - MAX_FIGURES_IN_TABLE
    return ", ".join(shown[:MAX_FIGURES_IN_TABLE]) + (f", ... ({more} more in the json)" if more > 0 else "")


def _error(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _header(document: dict) -> list[str]:
    v, device = document["versions"], document["device"]
    commit = (v.get("git_commit") or "unknown")[:10] + (" (uncommitted changes)" if v.get("git_dirty") else "")
    cuda = f"CUDA {v['cuda']}" if v.get("cuda") else "no CUDA"
    capability = device.get("capability")
    sm = f", sm{capability[0]}{capability[1]}" if capability else ""
    memory = f", {device['memory_gib']} GiB" if device.get("memory_gib") else ""
    state = "complete" if document["complete"] else "INCOMPLETE (still running, or stopped before the end)"
    counts = ", ".join(f"{n} {s}" for s, n in document["summary"].items() if n)
    return [
        f"# GPU check: {device['name']}{sm}{memory}, {document['date']}",
        "",
        f"torch {v['torch']} ({cuda}), commit {commit}; budget {document['budget_s']:.0f} s, "
        f"{document['elapsed_s']:.0f} s elapsed; {state}; {counts or 'nothing run'}.",
        "",
    ]


def _checks_table(records: list[dict]) -> list[str]:
    lines = ["| check | status | seconds | key figures | reason |", "|---|---|---:|---|---|"]
    for r in records:
        reason = r["reason"].split("\n")[0] if r["reason"] else ""
        row = [r["name"], r["status"], f"{r['seconds']:.0f}", _cell(key_figures(r)), _cell(reason)]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _comparisons_table(records: list[dict]) -> list[str]:
    rows = [(r["name"], c) for r in records for c in r.get("comparisons", [])]
    if not rows:
        return []
    lines = ["", "Predicted vs real (error = (predicted - real) / real):", ""]
    lines += ["| check | case | quantity | predicted | real | unit | error |", "|---|---|---|---:|---:|---|---:|"]
    for name, c in rows:
        values = [format_value(c["predicted"]), format_value(c["real"])]
        lines.append(f"| {name} | {c['case']} | {c['quantity']} | {' | '.join(values)} | {c['unit']} | "
                     f"{_error(c['rel_error'])} |")  # fmt: skip
    return lines


REHEARSAL_CLAIMS = (
    "CPU rehearsal: each claim is evaluated on the rehearsal's figures (the driver produces them) but "
    "not judged: tiny models on a CPU say nothing of a GPU's speed or memory."
)


def _claims_table(records: list[dict], rehearsal: bool) -> list[str]:
    rows = [(r["name"], c) for r in records for c in r.get("claims", [])]
    if not rows:
        return []
    lines = ["", "Claims (a claim missed or not measured on a GPU fails its check):", ""]
    if rehearsal:
        lines += [REHEARSAL_CLAIMS, ""]
    lines += ["| check | claim | bound | figures | verdict |", "|---|---|---|---|---|"]
    for name, c in rows:
        figures = ", ".join(f"{n} {format_value(v)}" for n, v in c["figures"].items()) or "-"
        verdict = c["verdict"] + (f" (evaluated: {c['evaluated']})" if "evaluated" in c else "")
        verdict += f": {c['reason']}" if c.get("reason") else ""  # unmeasured: what was missing, or why not applicable
        lines.append(f"| {name} | {c['claim']} | {c['bound']} | {_cell(figures)} | {verdict} |")
    return lines


def _notes(records: list[dict]) -> list[str]:
    notes = [f"- {r['name']}: {_cell(n)}" for r in records for n in r.get("notes", [])]
    return ["", "Notes:", "", *notes] if notes else []


def markdown(document: dict) -> str:
    records = document["checks"]
    claims = _claims_table(records, document["kind"] != "gpu")
    lines = _header(document) + _checks_table(records) + claims + _comparisons_table(records) + _notes(records)
    return "\n".join(lines) + "\n"
