"""The checkpoint folder: which steps are complete, their titan_meta.json, and the rules that keep a
crash from ever leaving a half-written checkpoint where a complete one is expected.

    <folder>/step-<N>/          a complete checkpoint: DCP files + .metadata + titan_meta.json
    <folder>/.step-<N>.tmp/     a save in progress (or interrupted by a crash): never loaded

A save writes into `.step-<N>.tmp`, then titan_meta.json (with the checksums of every file) last, then
renames the folder to `step-<N>`: the rename is atomic, so `step-<N>` exists only once it is complete.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from titan_checkpoint.errors import CheckpointCorruptError, CheckpointError, CheckpointMismatchError
from titan_checkpoint.storage import METADATA_FILE, _write_json

logger = logging.getLogger("titan.checkpoint")

META_FILE = "titan_meta.json"
FORMAT = "titan-checkpoint/1"
_STEP_DIR = re.compile(r"step-(\d+)")
_TMP_DIR = re.compile(r"\.step-(\d+)\.tmp")


def step_dir(folder: str | os.PathLike, step: int) -> Path:
    return Path(folder) / f"step-{step}"


def tmp_dir(folder: str | os.PathLike, step: int) -> Path:
    return Path(folder) / f".step-{step}.tmp"


def complete_steps(folder: str | os.PathLike) -> list[int]:
    """Steps with a complete checkpoint in `folder`, ascending. Interrupted saves (`.step-N.tmp`) are
    skipped; a `step-N` folder without its titan_meta.json is an error, since a save never leaves one."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    steps = []
    for entry in folder.iterdir():
        match = _STEP_DIR.fullmatch(entry.name)
        if match and entry.is_dir():
            if not (entry / META_FILE).is_file():
                raise CheckpointCorruptError(
                    f"{entry / META_FILE} is missing: {entry} was not written by a complete save "
                    f"(a save renames .step-N.tmp to step-N only after writing {META_FILE}); remove or repair it"
                )
            steps.append(int(match.group(1)))
        elif _TMP_DIR.fullmatch(entry.name):
            logger.debug(f"ignoring {entry}: an interrupted or unfinished save")
    return sorted(steps)


def latest_step(folder: str | os.PathLike) -> int | None:
    steps = complete_steps(folder)
    return steps[-1] if steps else None


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint given either as one step's folder or as a folder of steps (-> the latest)."""
    path = Path(path)
    if (path / META_FILE).is_file() or (path / METADATA_FILE).is_file():
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


def read_meta(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """titan_meta.json of one checkpoint; {} for a plain DCP folder that has none."""
    file = Path(checkpoint) / META_FILE
    if not file.exists():
        return {}
    try:
        meta = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointCorruptError(f"{file} cannot be read ({type(e).__name__}: {e}); the file is corrupt") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointCorruptError(f"{file} is not a {FORMAT} metadata file")
    return meta


def write_meta(checkpoint: str | os.PathLike, meta: dict[str, Any]) -> None:
    _write_json(Path(checkpoint) / META_FILE, {"format": FORMAT, **meta})


def commit(tmp: Path, final: Path) -> None:
    """Make the finished save `tmp` the checkpoint `final`, replacing an older one of the same step."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def purge(folder: str | os.PathLike, keep_latest_k: int, just_saved: int) -> list[int]:
    """Remove all but the `keep_latest_k` highest complete steps (0 keeps all), never `just_saved` (a run
    resumed from an earlier step saves below the abandoned later ones), and interrupted saves of earlier
    steps. Returns the steps removed."""
    folder = Path(folder)
    for entry in folder.iterdir():
        match = _TMP_DIR.fullmatch(entry.name)
        if match and int(match.group(1)) < just_saved:
            shutil.rmtree(entry, ignore_errors=True)
    if keep_latest_k <= 0:
        return []
    removed = [step for step in complete_steps(folder)[:-keep_latest_k] if step != just_saved]
    for step in removed:
        # Rename first so a crash mid-delete leaves a .tmp folder (ignored), never a partial step-N.
        doomed = tmp_dir(folder, step)
        shutil.rmtree(doomed, ignore_errors=True)
        os.rename(step_dir(folder, step), doomed)
        shutil.rmtree(doomed, ignore_errors=True)
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


def check_fingerprint(checkpoint: Path, meta: dict[str, Any], current: dict[str, Any] | None, enforce: bool) -> None:
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
