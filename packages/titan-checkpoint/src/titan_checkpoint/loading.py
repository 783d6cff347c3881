"""Reading one checkpoint back into Stateful objects, on every rank of a group: `load_checkpoint` for a
one-off load, `load_states` under it and under CheckpointManager.

Before any tensor is read: the files are checked (sizes and CRC-32s, the reading split among the ranks),
the checkpoint must hold every requested state, each rank-local state must have this rank's entry, and a
data-parallel state saved on another dp size must be able to reshard (it then reads every rank's entry).
Any failure is shared among the ranks, so all of them raise the same error instead of some waiting in a
collective for the others.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from titan_checkpoint.errors import CheckpointCorruptError, CheckpointMismatchError, raise_from_dcp
from titan_checkpoint.folder import check_fingerprint, checkpoint_location, read_meta
from titan_checkpoint.location import Location
from titan_checkpoint.states import DataParallelState, RankLocal
from titan_checkpoint.storage import (
    SafeLoadPlanner,
    checkpoint_reader,
    data_files,
    read_dcp_metadata,
    verify_files,
)

logger = logging.getLogger("titan.checkpoint")


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def gather_problems(problems: list[str], group: dist.ProcessGroup | None = None) -> list[str]:
    """Every rank's problems, on every rank (the same sorted list everywhere)."""
    if not _distributed():
        return problems
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, problems, group=group)
    return sorted({p for rank_problems in gathered for p in rank_problems})


def file_problems(
    path: Location, meta: dict[str, Any], *, group: dist.ProcessGroup | None = None, verify_checksums: bool = True
) -> list[str]:
    """What is wrong with the files of checkpoint `path` (missing, truncated, failing their CRC-32), each
    naming its file; the same list on every rank of `group` (each rank reads a share of the files)."""
    rank = dist.get_rank(group) if _distributed() else 0
    world_size = dist.get_world_size(group) if _distributed() else 1
    try:
        metadata = read_dcp_metadata(path)
    except CheckpointCorruptError as e:
        problems = [str(e)]
    else:
        recorded = meta.get("files")
        mine = data_files(path, metadata, recorded)[rank::world_size]
        problems = verify_files(path, metadata, recorded, check_crc=verify_checksums, only=mine)
    return gather_problems(problems, group)


def _entries(saved: dict, name: str) -> list[str]:
    """The keys under `name` in the checkpoint (`rank0`, `rank1`, ... for per-rank states)."""
    return sorted(k.split(".", 1)[1] for k in saved if k.startswith(f"{name}."))


def _rank_local_problems(path: Location, meta: dict, saved: dict, name: str, state: RankLocal, world_size: int) -> str:
    have = _entries(saved, name)
    message = (
        f"{path} holds {name} state for {', '.join(have) or 'no rank'} but not for {state.key}: the parallel "
        f"layout changed (saved by {meta.get('world_size', '?')} ranks, loading on {world_size})"
    )
    if state.required:
        return f"{message}; add {name!r} to checkpoint.exclude_from_loading to start it fresh"
    logger.warning(f"{message}; {name} keeps its current state")
    return ""


def load_states(
    path: Location,
    meta: dict[str, Any],
    states: dict[str, Any],
    names: list[str],
    *,
    group: dist.ProcessGroup | None = None,
    verify_checksums: bool = True,
    files_checked: bool = False,
) -> None:
    """Restore `states[name]` for each of `names` from the checkpoint folder `path` (whose titan_meta.json
    is `meta`, or {} for a plain DCP folder). Every rank of `group` calls it. files_checked: the caller has
    just had `file_problems` find none (skip reading every file a second time)."""
    start = time.perf_counter()
    world_size = dist.get_world_size(group) if _distributed() else 1
    metadata = read_dcp_metadata(path)
    if files_checked:
        problems = []
    else:
        problems = file_problems(path, meta, group=group, verify_checksums=verify_checksums)
    if problems:
        raise CheckpointCorruptError(f"checkpoint {path} is damaged: {'; '.join(problems)}")

    contents = meta.get("contents", ["model"])
    absent = [n for n in names if n not in contents]
    if absent:
        raise CheckpointMismatchError(
            f"{path} holds no {', '.join(map(repr, absent))} state (it holds {', '.join(contents)}); "
            f"add {absent} to checkpoint.exclude_from_loading to start them fresh"
        )
    saved = metadata.state_dict_metadata
    state_dict: dict[str, Any] = {}
    for name in names:
        state = states[name]
        if isinstance(state, DataParallelState):
            try:
                state_dict[name] = dict.fromkeys(state.entries_to_load(_entries(saved, name)), b"")
            except ValueError as e:
                problems.append(
                    f"{path}: {name} {e}; add {name!r} to checkpoint.exclude_from_loading to start it fresh"
                )
        elif isinstance(state, RankLocal) and f"{name}.{state.key}" not in saved:
            problem = _rank_local_problems(path, meta, saved, name, state, world_size)
            problems += [problem] if problem else []
        else:
            state_dict[name] = state.state_dict()
    problems = gather_problems(problems, group)
    if problems:
        raise CheckpointMismatchError("; ".join(problems))

    # A plain DCP folder (e.g. TorchTitan's) keeps the model's FQNs at the top level, not under "model.".
    model_at_top = not meta and "model" in state_dict and not any(k.startswith("model.") for k in saved)
    if model_at_top:
        model_keys = list(state_dict["model"])
        state_dict.update(state_dict.pop("model"))
    try:
        dcp.load(
            state_dict,
            storage_reader=checkpoint_reader(path),
            planner=SafeLoadPlanner(),
            process_group=group,
            no_dist=not _distributed(),
        )
    except BaseException as e:
        raise_from_dcp(e, f"loading {path} failed")
    if model_at_top:
        state_dict["model"] = {k: state_dict.pop(k) for k in model_keys}
    for name, value in state_dict.items():
        states[name].load_state_dict(value)
    if meta.get("world_size", world_size) != world_size:
        logger.info(f"checkpoint: resharded from {meta['world_size']} to {world_size} ranks")
    logger.info(f"checkpoint: loaded {', '.join(state_dict)} from {path} ({time.perf_counter() - start:.1f}s)")


def load_checkpoint(
    path: str | os.PathLike,
    states: dict[str, Any],
    *,
    fingerprint: dict[str, Any] | None = None,
    strict_fingerprint: bool = True,
    verify_checksums: bool = True,
    process_group: dist.ProcessGroup | None = None,
) -> int:
    """Restore every entry of `states` (name -> object with load_state_dict()) from one checkpoint, without a
    CheckpointManager: {"model": ModelState(model)} reads the weights alone, from a full or a model-only
    checkpoint, into any parallel layout. Returns the checkpoint's step (0 for a plain DCP folder).

    path: a step-<N> folder, a folder of them (the latest complete one), or a plain DCP folder. The checks
    are the manager's: every file's size and CRC-32 (verify_checksums), the fingerprint when one is given
    (strict_fingerprint=False warns instead of refusing), every requested state present. Every rank of
    `process_group` (default: the default group, if any) calls it.
    """
    checkpoint = checkpoint_location(path)
    meta = read_meta(checkpoint)
    check_fingerprint(checkpoint, meta, fingerprint, strict_fingerprint)
    load_states(checkpoint, meta, states, list(states), group=process_group, verify_checksums=verify_checksums)
    return int(meta.get("step", 0))
