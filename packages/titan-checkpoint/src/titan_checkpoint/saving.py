"""Writing one checkpoint, on every rank of a group: the DCP files into `.step-<N>.tmp` (on an object store,
into `step-<N>`), then (rank 0, after every rank has written) titan_meta.json with the size and CRC-32 of
every file, then the commit (folder.py: the atomic rename to `step-<N>`; on an object store the marker
itself). A crash at any point leaves no `step-<N>` that reads as complete.

`save_checkpoint` does this once, for a caller with no run to manage (`save_seed_checkpoint`, a
conversion); CheckpointManager does the same for each periodic save, synchronously or in the background.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from titan_checkpoint.errors import raise_from_dcp
from titan_checkpoint.folder import begin, commit, normalize_fingerprint, purge, step_dir, tmp_dir
from titan_checkpoint.location import Location, as_location
from titan_checkpoint.states import ModelState
from titan_checkpoint.storage import checksum_writer, collect_checksums

logger = logging.getLogger("titan.checkpoint")


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def start_save(folder: Location, step: int, group: dist.ProcessGroup | None) -> Location:
    """Rank 0 makes an empty place for the save (folder.begin), and every rank waits for it. Returns the
    folder to write into."""
    distributed = _distributed()
    if not distributed or dist.get_rank(group) == 0:
        begin(folder, step)
    if distributed:
        dist.barrier(group=group)
    return tmp_dir(folder, step)


def states_to_save(states: dict[str, Any], names: list[str], model_dtype: torch.dtype | None) -> dict[str, Any]:
    """{name: states[name].state_dict()} for `names`, the model's tensors cast to `model_dtype` if given."""
    state_dict = {name: states[name].state_dict() for name in names}
    if model_dtype is not None:
        state_dict["model"] = {k: v.to(model_dtype) for k, v in state_dict["model"].items()}
    return state_dict


def checkpoint_meta(
    step: int,
    names: list[str],
    model_dtype: torch.dtype | None,
    fingerprint: dict[str, Any] | None,
    layout: dict[str, Any] | None,
    world_size: int,
    model: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """titan_meta.json's fields but the file checksums, which commit_save adds once every file is written.
    model: what the model is ({"name", "args", ...}), for tools that rebuild it from the checkpoint alone;
    unlike the fingerprint it is never compared on load."""
    return {
        "step": step,
        "contents": names,
        "model_only": names == ["model"],
        "model_dtype": None if model_dtype is None else str(model_dtype).removeprefix("torch."),
        "fingerprint": normalize_fingerprint(fingerprint),
        "world_size": world_size,
        "layout": normalize_fingerprint(layout),
        **({} if model is None else {"model": normalize_fingerprint(model)}),
        "torch_version": torch.__version__,
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def commit_save(folder: Location, step: int, meta: dict[str, Any], keep_latest_k: int) -> None:
    """Rank 0, after every rank has written: checksums and titan_meta.json, the commit (folder.commit), then
    the retention rule (folder.purge; keep_latest_k=0 keeps every step)."""
    commit(folder, step, {**meta, "files": collect_checksums(tmp_dir(folder, step))})
    purge(folder, keep_latest_k, just_saved=step)


def save_checkpoint(
    folder: str | os.PathLike,
    step: int,
    states: dict[str, Any],
    *,
    fingerprint: dict[str, Any] | None = None,
    layout: dict[str, Any] | None = None,
    model_dtype: torch.dtype | None = None,
    model: dict[str, Any] | None = None,
    process_group: dist.ProcessGroup | None = None,
) -> Path | str:
    """Write `states` (name -> object with state_dict(), e.g. {"model": ModelState(model)} for the weights
    alone) as the complete checkpoint `<folder>/step-<step>`, synchronously, and return its path.

    The files, titan_meta.json and crash-safe rename are CheckpointManager's, so the manager, load_checkpoint
    and the export read it; no retention, RNG or async bookkeeping. fingerprint: JSON-able model
    description that loads compare against. layout: stored for information. model_dtype: cast the "model"
    state's tensors on the way out. model: what the model is (see checkpoint_meta). Every rank of
    `process_group` (default: the default group, if any) calls it.
    """
    folder, names, distributed = as_location(folder), list(states), _distributed()
    tmp = start_save(folder, step, process_group)
    start = time.perf_counter()
    state_dict = states_to_save(states, names, model_dtype)
    world_size = dist.get_world_size(process_group) if distributed else 1
    meta = checkpoint_meta(step, names, model_dtype, fingerprint, layout, world_size, model)
    try:
        dcp.save(state_dict, storage_writer=checksum_writer(tmp), process_group=process_group, no_dist=not distributed)
    except BaseException as e:
        raise_from_dcp(e, f"saving step {step} to {tmp} failed")
    if not distributed or dist.get_rank(process_group) == 0:
        commit_save(folder, step, meta, keep_latest_k=0)
    if distributed:
        dist.barrier(group=process_group)
    logger.info(f"checkpoint: saved step {step} to {step_dir(folder, step)} ({time.perf_counter() - start:.1f}s)")
    return step_dir(folder, step).plain


def save_seed_checkpoint(
    folder: str | os.PathLike,
    model: torch.nn.Module,
    *,
    fingerprint: dict[str, Any] | None = None,
    model_meta: dict[str, Any] | None = None,
) -> Path | str:
    """Write the initialized `model` as `<folder>/step-0`, model only: the seed every parallel layout
    starts from (DCP reshards it on load). Run in one process, before any training."""
    return save_checkpoint(folder, 0, {"model": ModelState(model)}, fingerprint=fingerprint, model=model_meta)
