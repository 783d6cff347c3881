"""Read flight-recorder dumps of all ranks and say which collective each rank was on and who disagrees.

Reads torch's dump format (pickle, or the JSON of ``_dump_fr_trace_json``) from NCCL and gloo runs alike.
torch's own analyzer (``python -m torch.distributed.flight_recorder.fr_trace``) raises ``KeyError`` on gloo
dumps: gloo leaves the process-group config keyed by "" instead of the group's name.

What a gloo dump can and cannot tell: gloo records each collective when it is issued, with its group,
sequence id, sizes and dtypes, but not when it starts or completes (``state`` stays "scheduled") and a
collective that failed by timeout is still marked retired. So on gloo the evidence is the *last* collective
of each rank and the comparison across ranks, which is what the findings below are built from:

    mismatch   the same (group, sequence id) is a different op, size or dtype on different ranks
    behind     a rank's last collective in a group has a lower sequence id than another rank's
    in flight  a collective not retired when the dump was taken (NCCL: the one that hung)
    missing    a rank named in a group's config that left no dump (crashed, or killed before dumping)
"""

from __future__ import annotations

import json
import pickle
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

_RANK_IN_NAME = re.compile(r"(\d+)(?:\.(?:json|pickle|pkl))?$")


def load_flight_recorder(folder: str | Path) -> dict[int, dict[str, Any]]:
    """``{rank: dump}`` for every dump file in ``folder`` (or in its ``comm_traces`` subfolder).

    The rank is the number that ends the file name (``rank_3``, ``nccl_trace_rank_3.json``). Dumps are
    pickles written by torch; read only dumps you trust.
    """
    folder = _trace_folder(folder)
    dumps = {}
    for path in sorted(folder.iterdir()):
        match = _RANK_IN_NAME.search(path.name)
        if not path.is_file() or match is None:
            continue
        data = path.read_bytes()
        dump = json.loads(data) if data.lstrip().startswith(b"{") else pickle.loads(data)
        for entry in dump.get("entries", []):
            entry["process_group"] = tuple(entry.get("process_group") or ("?", "?"))
        dumps[int(match.group(1))] = dump
    if not dumps:
        raise FileNotFoundError(f"no flight-recorder dumps (files named ...<rank>) in {folder}")
    return dumps


def summarize_flight_recorder(folder: str | Path, last: int = 10) -> str:
    """A per-rank table of the last ``last`` collectives, then the findings (mismatch, behind, ...)."""
    dumps = load_flight_recorder(folder)
    lines = [f"flight recorder: {len(dumps)} rank(s) {sorted(dumps)} from {_trace_folder(folder)}"]
    for rank, dump in sorted(dumps.items()):
        entries = dump.get("entries", [])
        lines.append(f"\nrank {rank}: {len(entries)} collectives recorded, last {min(last, len(entries))}:")
        lines.append(
            f"  {'group':<16} {'seq':>6}  {'op':<18} {'state':<10} {'retired':<7} {'in':<14} {'out':<14} dtype"
        )
        for entry in entries[-last:]:
            lines.append("  " + _format_entry(entry))
    findings = _findings(dumps)
    lines.append("\nfindings:")
    lines.extend(f"  {finding}" for finding in findings or ["none: every rank agrees on its last collectives"])
    if _only_gloo(dumps):
        lines.append(
            "note: gloo records no start or completion (state stays 'scheduled', a timed-out collective is "
            "still retired); the last collective of each rank is the one it was waiting on."
        )
    return "\n".join(lines)


def _trace_folder(folder: str | Path) -> Path:
    folder = Path(folder)
    return folder / "comm_traces" if (folder / "comm_traces").is_dir() else folder


def _format_entry(entry: dict[str, Any]) -> str:
    seq = f"p2p {entry.get('p2p_seq_id')}" if entry.get("is_p2p") else str(entry.get("collective_seq_id"))
    dtypes = ",".join(sorted(set(entry.get("input_dtypes") or []))) or "-"
    return (
        f"{_group_name(entry):<16} {seq:>6}  {_op(entry):<18} {entry.get('state', '?'):<10} "
        f"{'yes' if entry.get('retired') else 'no':<7} {_sizes(entry.get('input_sizes')):<14} "
        f"{_sizes(entry.get('output_sizes')):<14} {dtypes}"
    )


def _findings(dumps: dict[int, dict[str, Any]]) -> list[str]:
    findings = []
    # (group name, seq) -> rank -> entry, collectives only: p2p sequence ids are per peer pair.
    by_seq: dict[tuple[str, int], dict[int, dict]] = defaultdict(dict)
    groups: dict[str, str] = {}
    for rank, dump in dumps.items():
        for entry in dump.get("entries", []):
            if entry.get("is_p2p"):
                continue
            name = entry["process_group"][0]
            groups[name] = _group_name(entry)
            by_seq[(name, int(entry["collective_seq_id"]))][rank] = entry

    for (name, seq), entries in sorted(by_seq.items()):
        signatures = {rank: _signature(entry) for rank, entry in entries.items()}
        if len(set(signatures.values())) > 1:
            ranks = ", ".join(f"rank {r} {_describe(entries[r])}" for r in sorted(entries))
            findings.append(f"MISMATCH group {groups[name]} seq {seq}: {ranks}")

    last_seq: dict[str, dict[int, int]] = defaultdict(dict)
    for (name, seq), entries in by_seq.items():
        for rank in entries:
            last_seq[name][rank] = max(seq, last_seq[name].get(rank, 0))
    for name, per_rank in sorted(last_seq.items()):
        ahead = max(per_rank.values())
        behind = {rank: seq for rank, seq in per_rank.items() if seq < ahead}
        if behind:
            leaders = sorted(rank for rank, seq in per_rank.items() if seq == ahead)
            lagging = ", ".join(f"rank {r} at seq {s}" for r, s in sorted(behind.items()))
            findings.append(f"BEHIND group {groups[name]}: {lagging}; ranks {leaders} reached seq {ahead}")

    for rank, dump in sorted(dumps.items()):
        for entry in dump.get("entries", []):
            if not entry.get("retired", True):
                findings.append(
                    f"IN FLIGHT rank {rank} group {_group_name(entry)} seq {entry.get('collective_seq_id')}: "
                    f"{_describe(entry)}, state {entry.get('state')}"
                )

    missing = sorted(_configured_ranks(dumps) - set(dumps))
    if missing:
        findings.append(f"MISSING no dump from ranks {missing} (crashed, or killed before dumping)")
    return findings


def _signature(entry: dict[str, Any]) -> tuple:
    return (
        _op(entry),
        _sizes(entry.get("input_sizes")),
        _sizes(entry.get("output_sizes")),
        tuple(entry.get("input_dtypes") or ()),
    )


def _describe(entry: dict[str, Any]) -> str:
    dtypes = ",".join(sorted(set(entry.get("input_dtypes") or []))) or "-"
    return f"{_op(entry)} in {_sizes(entry.get('input_sizes'))} out {_sizes(entry.get('output_sizes'))} {dtypes}"


def _op(entry: dict[str, Any]) -> str:
    name = str(entry.get("profiling_name", "?"))
    return name.split(":", 1)[-1]  # "gloo:all_reduce", "nccl:all_reduce" -> "all_reduce"


def _group_name(entry: dict[str, Any]) -> str:
    name, desc = entry["process_group"][:2]
    return f"{name}:{desc}" if desc and desc != "undefined" else str(name)


def _sizes(sizes: Any) -> str:
    if not sizes:
        return "-"
    return " ".join("[" + "x".join(str(d) for d in size) + "]" for size in sizes)


def _only_gloo(dumps: dict[int, dict[str, Any]]) -> bool:
    names = [str(e.get("profiling_name", "")) for dump in dumps.values() for e in dump.get("entries", [])]
    return bool(names) and all(name.startswith("gloo:") for name in names)


def _configured_ranks(dumps: dict[int, dict[str, Any]]) -> set[int]:
    ranks: set[int] = set()
    for dump in dumps.values():
        for config in dump.get("pg_config", {}).values():
            try:
                ranks.update(int(r) for r in json.loads(config.get("ranks", "[]")))
            except (TypeError, ValueError):
                continue
    return ranks
