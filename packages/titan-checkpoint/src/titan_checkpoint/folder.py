"""The checkpoint folder: which steps are complete, their titan_meta.json, and the rules that keep a
crash from ever leaving a half-written checkpoint where a complete one is expected.

    <folder>/step-<N>/          a complete checkpoint: DCP files + .metadata + titan_meta.json
    <folder>/.step-<N>.tmp/     a save in progress (or interrupted by a crash) on local disk: never loaded

A save writes its files, then titan_meta.json (with the checksums of every file) last: the commit marker.
How the save then becomes `step-<N>` is the location's commit protocol (location/): on local disk it was
written into `.step-<N>.tmp`, renamed into place atomically; on an object store (no atomic rename) it was
written straight into `step-<N>/`, and a `step-<N>/` without its marker is a save that did not finish.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from titan_checkpoint.errors import CheckpointCorruptError, CheckpointError, CheckpointMismatchError
from titan_checkpoint.location import Location, as_location
from titan_checkpoint.storage import METADATA_FILE

logger = logging.getLogger("titan.checkpoint")

META_FILE = "titan_meta.json"
FORMAT = "titan-checkpoint/1"
_STEP_DIR = re.compile(r"step-(\d+)")
_TMP_DIR = re.compile(r"\.step-(\d+)\.tmp")

Folder = str | os.PathLike | Location


def step_dir(folder: Folder, step: int) -> Location:
    return as_location(folder).join(f"step-{step}")


def tmp_dir(folder: Folder, step: int) -> Location:
    """Where a save of `step` writes: a temporary folder renamed into place, or (object store) the step's own."""
    return step_dir(folder, step).staging()


def complete_steps(folder: Folder) -> list[int]:
    """Steps with a complete checkpoint in `folder`, ascending. Interrupted saves are skipped (`.step-N.tmp`,
    or on an object store a `step-N` without its marker); a local `step-N` folder without its
    titan_meta.json is an error, since a save never leaves one."""
    folder = as_location(folder)
    steps = []
    for name, is_folder in folder.list_dir():
        match = _STEP_DIR.fullmatch(name)
        if match and is_folder:
            if folder.join(name).committed(META_FILE):
                steps.append(int(match.group(1)))
        elif _TMP_DIR.fullmatch(name):
            logger.debug(f"ignoring {folder.join(name)}: an interrupted or unfinished save")
    return sorted(steps)


def latest_step(folder: Folder) -> int | None:
    steps = complete_steps(folder)
    return steps[-1] if steps else None


def resolve_checkpoint(path: Folder) -> Path | str:
    """A checkpoint given either as one step's folder or as a folder of steps (-> the latest): its path, or
    its URL on an object store."""
    return checkpoint_location(path).plain


def checkpoint_location(path: Folder) -> Location:
    """resolve_checkpoint's answer as a Location."""
    path = as_location(path)
    if path.join(META_FILE).is_file() or path.join(METADATA_FILE).is_file():
        return path
    if _TMP_DIR.fullmatch(path.name):
        raise CheckpointError(f"{path} is an interrupted save, not a complete checkpoint")
    step = latest_step(path)
    if step is None:
        raise CheckpointError(
            f"{path} holds no complete checkpoint (expected a step-<N> folder with {META_FILE}, "
            f"or a DCP folder with {METADATA_FILE})"
        )
    return step_dir(path, step)


def read_meta(checkpoint: Folder) -> dict[str, Any]:
    """titan_meta.json of one checkpoint; {} for a plain DCP folder that has none."""
    file = as_location(checkpoint).join(META_FILE)
    if not file.is_file():
        return {}
    try:
        meta = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointCorruptError(f"{file} cannot be read ({type(e).__name__}: {e}); the file is corrupt") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointCorruptError(f"{file} is not a {FORMAT} metadata file")
    return meta


def write_meta(checkpoint: Folder, meta: dict[str, Any]) -> None:
    as_location(checkpoint).join(META_FILE).write_json({"format": FORMAT, **meta})


def begin(folder: Folder, step: int) -> Location:
    """An empty place for a save of `step`, removing what an interrupted save of it left (a complete
    checkpoint of the same step is un-committed first where the save writes in place)."""
    final = step_dir(folder, step)
    final.begin(META_FILE)
    return final.staging()


def commit(folder: Folder, step: int, meta: dict[str, Any]) -> None:
    """Make the finished save of `step` the checkpoint `step-<N>` by writing its titan_meta.json last, then
    the location's commit (local disk: the atomic rename, replacing an older one of the same step)."""
    final = step_dir(folder, step)
    write_meta(final.staging(), meta)
    final.publish()


def purge(folder: Folder, keep_latest_k: int, just_saved: int) -> list[int]:
    """Remove all but the `keep_latest_k` highest complete steps (0 keeps all), never `just_saved` (a run
    resumed from an earlier step saves below the abandoned later ones), and interrupted saves of earlier
    steps. Returns the steps removed."""
    folder = as_location(folder)
    complete = complete_steps(folder)
    for name, _ in folder.list_dir():
        match = _TMP_DIR.fullmatch(name) or _STEP_DIR.fullmatch(name)
        if match and int(match.group(1)) < just_saved and int(match.group(1)) not in complete:
            folder.join(name).remove()
    if keep_latest_k <= 0:
        return []
    removed = [step for step in complete[:-keep_latest_k] if step != just_saved]
    for step in removed:
        step_dir(folder, step).discard(META_FILE)
    if removed:
        logger.info(f"checkpoint: removed step(s) {', '.join(map(str, removed))} (keep_latest_k={keep_latest_k})")
    return removed


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: data}


def normalize_fingerprint(fingerprint: dict[str, Any] | None) -> dict[str, Any] | None:
    """The fingerprint as it reads back from JSON (tuples become lists), so comparisons are exact."""
    return None if fingerprint is None else json.loads(json.dumps(fingerprint))


def fingerprint_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """'field: checkpoint X, this run Y' for every field that differs between two fingerprints."""
    saved_flat, current_flat = _flatten(saved), _flatten(normalize_fingerprint(current))
    diffs = []
    for key in sorted(set(saved_flat) | set(current_flat)):
        if key in saved_flat and key in current_flat and saved_flat[key] == current_flat[key]:
            continue
        a = repr(saved_flat[key]) if key in saved_flat else "(absent)"
        b = repr(current_flat[key]) if key in current_flat else "(absent)"
        diffs.append(f"{key}: checkpoint {a}, this run {b}")
    return diffs


def check_fingerprint(checkpoint: Folder, meta: dict[str, Any], current: dict[str, Any] | None, enforce: bool) -> None:
    """Refuse (or, with enforce=False, warn about) a checkpoint written for a different model config."""
    saved = meta.get("fingerprint")
    if current is None or saved is None:
        return
    diffs = fingerprint_differences(saved, current)
    if not diffs:
        return
    message = (
        f"{checkpoint} was written by a run with a different model config: {'; '.join(diffs)}. "
        "Point the run at another checkpoint folder, or set check_fingerprint=False to load it anyway "
        "(e.g. fine-tuning with a changed max_seq_len)"
    )
    if enforce:
        raise CheckpointMismatchError(message)
    logger.warning(message)
