"""The checkpoint folder: which steps are complete, their titan_meta.json, and the rules that keep a
crash from ever leaving a half-written checkpoint where a complete one is expected.

On a local disk:

    <folder>/step-<N>/          a complete checkpoint: DCP files + .metadata + titan_meta.json
    <folder>/.step-<N>.tmp/     a save in progress (or interrupted by a crash): never loaded

A save writes into `.step-<N>.tmp`, then titan_meta.json (with the checksums of every file) last, then
renames the folder to `step-<N>`: the rename is atomic, so `step-<N>` exists only once it is complete.

On an object store (no atomic rename; see location.py) a save writes straight into `step-<N>/`, and
titan_meta.json, written last as one object, is the commit marker: a `step-<N>/` without it is a save
that did not finish and is never loaded. Removing a checkpoint deletes its marker first.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

import titan_checkpoint.location as loc
from titan_checkpoint.errors import CheckpointCorruptError, CheckpointError, CheckpointMismatchError
from titan_checkpoint.location import Location, as_location
from titan_checkpoint.storage import METADATA_FILE

logger = logging.getLogger("titan.checkpoint")

META_FILE = "titan_meta.json"
FORMAT = "titan-checkpoint/1"
_STEP_DIR = re.compile(r"step-(\d+)")
_TMP_DIR = re.compile(r"\.step-(\d+)\.tmp")


def step_dir(folder: str | os.PathLike, step: int) -> Location:
    return loc.join(as_location(folder), f"step-{step}")


def tmp_dir(folder: str | os.PathLike, step: int) -> Location:
    """Where a save of `step` writes: a temporary folder renamed into place, or (object store) the step's own."""
    folder = as_location(folder)
    return loc.join(folder, f".step-{step}.tmp") if loc.atomic_rename(folder) else step_dir(folder, step)


def complete_steps(folder: str | os.PathLike) -> list[int]:
    """Steps with a complete checkpoint in `folder`, ascending. Interrupted saves are skipped (`.step-N.tmp`,
    or on an object store a `step-N` without its marker); a local `step-N` folder without its
    titan_meta.json is an error, since a save never leaves one."""
    folder = as_location(folder)
    steps = []
    for name, is_folder in loc.list_dir(folder):
        match = _STEP_DIR.fullmatch(name)
        if match and is_folder:
            entry = loc.join(folder, name)
            if not loc.is_file(loc.join(entry, META_FILE)):
                if not loc.atomic_rename(folder):
                    logger.debug(f"ignoring {entry}: no {META_FILE}, a save that did not finish")
                    continue
                raise CheckpointCorruptError(
                    f"{loc.join(entry, META_FILE)} is missing: {entry} was not written by a complete save "
                    f"(a save renames .step-N.tmp to step-N only after writing {META_FILE}); remove or repair it"
                )
            steps.append(int(match.group(1)))
        elif _TMP_DIR.fullmatch(name):
            logger.debug(f"ignoring {loc.join(folder, name)}: an interrupted or unfinished save")
    return sorted(steps)


def latest_step(folder: str | os.PathLike) -> int | None:
    steps = complete_steps(folder)
    return steps[-1] if steps else None


def resolve_checkpoint(path: str | os.PathLike) -> Location:
    """A checkpoint given either as one step's folder or as a folder of steps (-> the latest)."""
    path = as_location(path)
    if loc.is_file(loc.join(path, META_FILE)) or loc.is_file(loc.join(path, METADATA_FILE)):
        return path
    if _TMP_DIR.fullmatch(loc.name_of(path)):
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
    file = loc.join(as_location(checkpoint), META_FILE)
    if not loc.is_file(file):
        return {}
    try:
        meta = json.loads(loc.read_text(file))
    except (OSError, ValueError) as e:
        raise CheckpointCorruptError(f"{file} cannot be read ({type(e).__name__}: {e}); the file is corrupt") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointCorruptError(f"{file} is not a {FORMAT} metadata file")
    return meta


def write_meta(checkpoint: str | os.PathLike, meta: dict[str, Any]) -> None:
    loc.write_json(loc.join(as_location(checkpoint), META_FILE), {"format": FORMAT, **meta})


def begin(folder: Location, step: int) -> Location:
    """An empty place for a save of `step`, removing what an interrupted save of it left. On an object store
    that is `step-<N>` itself: a complete checkpoint of the same step (a run resumed from an earlier step)
    is un-committed first, so it never reads as complete with some of the new files in it."""
    target = tmp_dir(folder, step)
    if not loc.atomic_rename(folder):
        loc.remove(loc.join(target, META_FILE))
    loc.remove(target)
    loc.make_dirs(target)
    return target


def commit(folder: Location, step: int, meta: dict[str, Any]) -> None:
    """Make the finished save of `step` the checkpoint `step-<N>` by writing its titan_meta.json last: locally
    into the temporary folder, then the atomic rename (replacing an older one of the same step); on an
    object store the marker itself is the commit."""
    tmp, final = tmp_dir(folder, step), step_dir(folder, step)
    write_meta(tmp, meta)
    if not loc.atomic_rename(folder):
        return
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old")
        loc.remove(old)
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    if old is not None:
        loc.remove(old)


def _fsync_dir(path: os.PathLike) -> None:
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


def _remove_checkpoint(folder: Location, step: int) -> None:
    """Delete a complete checkpoint so that a crash midway leaves an ignored leftover, never a partial
    `step-N` that reads as complete: locally by renaming it to `.step-N.tmp` first, on an object store by
    deleting its marker first."""
    if loc.atomic_rename(folder):
        doomed = loc.join(folder, f".step-{step}.tmp")
        loc.remove(doomed)
        os.rename(step_dir(folder, step), doomed)
    else:
        doomed = step_dir(folder, step)
        loc.remove(loc.join(doomed, META_FILE))
    loc.remove(doomed)


def purge(folder: str | os.PathLike, keep_latest_k: int, just_saved: int) -> list[int]:
    """Remove all but the `keep_latest_k` highest complete steps (0 keeps all), never `just_saved` (a run
    resumed from an earlier step saves below the abandoned later ones), and interrupted saves of earlier
    steps. Returns the steps removed."""
    folder = as_location(folder)
    complete = complete_steps(folder)
    for name, _ in loc.list_dir(folder):
        match = _TMP_DIR.fullmatch(name) or _STEP_DIR.fullmatch(name)
        if match and int(match.group(1)) < just_saved and int(match.group(1)) not in complete:
            loc.remove(loc.join(folder, name))
    if keep_latest_k <= 0:
        return []
    removed = [step for step in complete[:-keep_latest_k] if step != just_saved]
    for step in removed:
        _remove_checkpoint(folder, step)
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


def check_fingerprint(
    checkpoint: Location, meta: dict[str, Any], current: dict[str, Any] | None, enforce: bool
) -> None:
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
