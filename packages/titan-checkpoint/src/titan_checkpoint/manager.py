"""CheckpointManager: save a training run's states with torch.distributed.checkpoint, and resume it.

The trainer hands over named Stateful objects; each save writes all of them (or only the model), each load
restores them. Saves are complete or absent (see folder.py), optionally asynchronous, and loads check the
files and the model fingerprint before reading a tensor. Every rank calls every method.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, AsyncSaveResponse

from titan_checkpoint.adapters import adapter_from_fingerprint, adapter_from_meta, check_imported_model
from titan_checkpoint.config import CheckpointConfig
from titan_checkpoint.errors import CheckpointCorruptError, CheckpointError, raise_from_dcp
from titan_checkpoint.folder import (
    check_fingerprint,
    checkpoint_location,
    complete_steps,
    normalize_fingerprint,
    read_meta,
    step_dir,
    tmp_dir,
)
from titan_checkpoint.hf_export import export_safetensors
from titan_checkpoint.hf_import import is_hf_folder, load_hf_into_model, local_hf_folder
from titan_checkpoint.loading import file_problems, gather_problems, load_states
from titan_checkpoint.location import Location, as_location
from titan_checkpoint.saving import checkpoint_meta, commit_save, start_save, states_to_save
from titan_checkpoint.states import ModelState, RankLocal, RNGState
from titan_checkpoint.storage import checksum_writer

logger = logging.getLogger("titan.checkpoint")


class CheckpointManager:
    """Periodic, crash-safe checkpoints of a training run in `folder`.

    states: name -> object with state_dict()/load_state_dict(), e.g. {"model": ModelState(model),
        "optimizer": OptimizerState(model, optimizer), "lr_scheduler": scheduler, "dataloader":
        DataParallelState(dataloader, dp_rank, dp_world_size), "train_state": train_state}. "model" must
        be a ModelState. Unless config.save_rng is False an "rng" entry (RankLocal(RNGState(),
        required=False)) is added.
    fingerprint: JSON-able description of the model, stored with each checkpoint; a checkpoint whose
        fingerprint differs is refused on load. Include "name" (the HF adapter's entry-point name) and
        "args" (what the adapter's from_args_dict takes) so the checkpoint can be exported.
    layout: JSON-able description of the parallel layout, stored for information.
    model_meta: JSON-able description of the model as tools rebuild it from the checkpoint alone ({"name",
        "args" (complete, max_seq_len included), ...}); stored, never compared (see the fingerprint for that).
    hf_adapter: adapter for initial_load_format="hf" and export (default: found from the fingerprint).
    process_group: group for DCP collectives (default: the default group, if one is initialized).
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        states: dict[str, Any],
        config: CheckpointConfig | None = None,
        *,
        fingerprint: dict[str, Any] | None = None,
        layout: dict[str, Any] | None = None,
        model_meta: dict[str, Any] | None = None,
        hf_adapter: Any = None,
        process_group: dist.ProcessGroup | None = None,
    ):
        self.config = config or CheckpointConfig()
        self.config.validate()
        self._location = as_location(folder)
        self.folder = self._location.plain  # as callers gave it: a Path, or the URL
        self.states = dict(states)
        if self.config.save_rng and "rng" not in self.states:
            self.states["rng"] = RankLocal(RNGState(), required=False)
        if "model" in self.states and not isinstance(self.states["model"], ModelState):
            raise TypeError(f"states['model'] is a {type(self.states['model']).__name__}; wrap it: ModelState(model)")
        if self.config.model_only and "model" not in self.states:
            raise ValueError("checkpoint.model_only=True needs a 'model' entry in states")
        self.fingerprint = normalize_fingerprint(fingerprint)
        self.layout = normalize_fingerprint(layout)
        self.model_meta = normalize_fingerprint(model_meta)
        self.hf_adapter = hf_adapter
        self._pg = process_group
        self._dist = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(process_group) if self._dist else 0
        self.world_size = dist.get_world_size(process_group) if self._dist else 1
        self._check_writable()
        self._pending: Future | None = None
        self._pending_step: int | None = None
        self._staging: Future | None = None
        self._last_saved: int | None = None
        self.loaded_from: Path | str | None = None  # the checkpoint the last load() read
        self._async_pg = None
        self._stager = None
        self.async_mode = self._setup_async(self.config.async_mode)

    def _check_writable(self) -> None:
        """Rank 0 writes and deletes a small object in an object-store folder; every rank raises what failed,
        before the first step rather than at the first save."""
        if not self._location.probed_before_use:
            return
        problems = []
        if self.rank == 0:
            try:
                self._location.check_writable("checkpoint.folder")
            except ValueError as e:
                problems.append(str(e))
        problems = gather_problems(problems, self._pg)
        if problems:
            raise CheckpointError(problems[0])

    # ---- saving -------------------------------------------------------------------------------------

    def _setup_async(self, mode: str) -> str:
        if mode == "async_with_pinned_mem" and not torch.accelerator.is_available():
            logger.warning(
                "checkpoint.async_mode=async_with_pinned_mem: pinned memory needs an accelerator and there is "
                "none; saving with async_mode=async instead (staged in ordinary CPU memory)"
            )
            mode = "async"
        if mode != "disabled" and self._dist:
            # DCP runs its collectives in the writer thread: a group of their own keeps them from
            # interleaving with the training step's collectives. gloo: staged tensors are on the CPU.
            ranks = None if self._pg is None else dist.get_process_group_ranks(self._pg)
            self._async_pg = dist.new_group(ranks=ranks, backend="gloo")
        if mode == "async_with_pinned_mem":
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            self._stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=True, use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=True
                )
            )
        return mode

    def save(self, step: int, *, last: bool = False) -> bool:
        """Save if `step` is a multiple of interval, or if `last` (the end of training: model only when
        config.model_only). Waits for a previous asynchronous save first. Returns whether it saved."""
        interval = self.config.interval
        if not (last or (interval > 0 and step % interval == 0)) or step == self._last_saved:
            return False
        self.wait()
        if last and self.config.model_only:
            self._save(step, ["model"], getattr(torch, self.config.export_dtype))  # a name in EXPORT_DTYPES
        else:
            self._save(step, list(self.states), None)
        self._last_saved = step
        return True

    def _barrier(self) -> None:
        if self._dist:
            dist.barrier(group=self._pg)

    def _save(self, step: int, names: list[str], model_dtype: torch.dtype | None) -> None:
        tmp = start_save(self._location, step, self._pg)
        start = time.perf_counter()
        state_dict = states_to_save(self.states, names, model_dtype)
        meta = checkpoint_meta(
            step, names, model_dtype, self.fingerprint, self.layout, self.world_size, self.model_meta
        )
        writer = checksum_writer(tmp)
        if self.async_mode == "disabled":
            try:
                dcp.save(state_dict, storage_writer=writer, process_group=self._pg, no_dist=not self._dist)
            except BaseException as e:
                raise_from_dcp(e, f"saving step {step} to {tmp} failed")
            if self.rank == 0:
                self._commit(step, meta)
            self._barrier()
            seconds = time.perf_counter() - start
            logger.info(f"checkpoint: saved step {step} to {step_dir(self._location, step)} ({seconds:.1f}s)")
            return

        try:
            response = dcp.async_save(
                state_dict,
                storage_writer=writer,
                process_group=self._async_pg,
                async_checkpointer_type=AsyncCheckpointerType.THREAD,
                async_stager=self._stager,
                no_dist=not self._dist,
            )
        except BaseException as e:
            raise_from_dcp(e, f"saving step {step} to {tmp} failed")
        if isinstance(response, AsyncSaveResponse):
            upload, self._staging = response.upload_completion, response.staging_completion
        else:
            upload = response
        pending: Future = Future()

        def finish(future: Future) -> None:
            try:
                future.result()
                if self.rank == 0:
                    self._commit(step, meta)
                    seconds = time.perf_counter() - start
                    logger.info(
                        f"checkpoint: saved step {step} to {step_dir(self._location, step)} ({seconds:.1f}s, async)"
                    )
                pending.set_result(step)
            except BaseException as e:  # surfaced by wait()
                pending.set_exception(e)

        upload.add_done_callback(finish)
        self._pending, self._pending_step = pending, step
        logger.debug(f"checkpoint: step {step} staged in {time.perf_counter() - start:.2f}s; writing in the background")

    def _commit(self, step: int, meta: dict[str, Any]) -> None:
        commit_save(self._location, step, meta, self.config.keep_latest_k)

    def wait_for_staging(self) -> None:
        """Block until an asynchronous save has copied the state off the parameters; call it before the
        optimizer step changes them (a no-op unless async_with_pinned_mem stages in the background)."""
        if self._staging is not None:
            self._staging.result()
            self._staging = None

    def wait(self) -> None:
        """Block until an asynchronous save is complete; raise CheckpointError if it failed."""
        if self._pending is None:
            return
        pending, step = self._pending, self._pending_step
        self._pending = self._staging = None
        try:
            pending.result()
        except BaseException as e:
            raise_from_dcp(
                e, f"saving step {step} to {tmp_dir(self._location, step)} failed; the previous checkpoint stays"
            )

    def close(self) -> None:
        """Finish an in-flight save and release the staging buffers. Call on every rank at the end."""
        try:
            self.wait()
        finally:
            if self._stager is not None:
                self._stager.close()
                self._stager = None
        self._barrier()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- loading ------------------------------------------------------------------------------------

    def load(self, step: int | None = None) -> int:
        """Restore the states from the checkpoint of `step` (default: config.load_step, else the latest
        complete one). With no checkpoint in the folder: initial_load_path if set, else nothing. Returns
        the step to continue from (0 for a fresh start or initial weights)."""
        self.wait()
        if step is None and self.config.load_step >= 0:
            step = self.config.load_step
        steps = complete_steps(self._location)
        if step is not None and step not in steps:
            raise CheckpointError(
                f"checkpoint.load_step={step}: {step_dir(self._location, step)} is not a complete checkpoint; "
                f"complete steps in {self._location}: {', '.join(map(str, steps)) or 'none'}"
            )
        if step is None and not steps:
            return self._initial_load()
        files_checked = False
        if step is None:
            step, files_checked = self._latest_intact(steps), True
        path = step_dir(self._location, step)
        meta = read_meta(path)
        check_fingerprint(path, meta, self.fingerprint, self.config.check_fingerprint)
        self._check_imported_model(path, meta)
        names = [n for n in self.states if n not in self.config.exclude_from_loading]
        if meta.get("model_only"):
            if step > 0:
                full = [s for s in steps if s != step and not read_meta(step_dir(self._location, s)).get("model_only")]
                raise CheckpointError(
                    f"{path} holds only model weights (a model_only final save) and cannot resume training; "
                    f"start from it with initial_load_path={str(path)!r} in a new folder, or set load_step to a "
                    f"complete checkpoint ({', '.join(map(str, full)) or 'none in this folder'})"
                )
            logger.info(f"checkpoint: {path} is a seed checkpoint: loading the model; other states start fresh")
            names = [n for n in names if n == "model"]
        load_states(
            path,
            meta,
            self.states,
            names,
            group=self._pg,
            verify_checksums=self.config.verify_checksums,
            files_checked=files_checked,
        )
        self._last_saved = step  # saving it again would rewrite the same state
        self.loaded_from = path.plain
        return int(meta["step"])

    def _latest_intact(self, steps: list[int]) -> int:
        """The newest of `steps` whose files pass their checks, the same on every rank (the checks are
        shared). A damaged newer one is reported and skipped: auto-resume must neither crash-loop on it
        nor start over. All of them damaged is an error."""
        damaged = []
        for step in reversed(steps):
            path = step_dir(self._location, step)
            try:
                meta = read_meta(path)
            except CheckpointCorruptError as e:
                problems = [str(e)]
            else:
                problems = file_problems(path, meta, group=self._pg, verify_checksums=self.config.verify_checksums)
            if not problems:
                return step
            damaged.append(f"step {step}: {'; '.join(problems)}")
            logger.warning(
                f"checkpoint: {path} is damaged and will not be loaded: {'; '.join(problems)}; "
                "trying the previous complete checkpoint"
            )
        raise CheckpointCorruptError(
            f"every checkpoint in {self._location} is damaged ({' | '.join(damaged)}); restore the files, or move "
            "the folder away to start from scratch"
        )

    def _check_imported_model(self, checkpoint: Location, meta: dict[str, Any]) -> None:
        """A checkpoint without a fingerprint but with a model description (`titan-checkpoint import`) is
        compared by what its model is."""
        if meta.get("fingerprint") is None and meta.get("model") and self.fingerprint:
            check_imported_model(checkpoint, meta["model"], self.model_meta or self.fingerprint)

    def _initial_load(self) -> int:
        path, cfg = self.config.initial_load_path, self.config
        if not path:
            logger.info(f"checkpoint: no checkpoint in {self._location}; starting from step 0")
            return 0
        if "model" not in self.states:
            raise ValueError("checkpoint.initial_load_path needs a 'model' entry in states")
        if cfg.initial_load_format == "hf" or is_hf_folder(path):
            adapter = self.hf_adapter or adapter_from_fingerprint(self.model_meta or self.fingerprint)
            with local_hf_folder(path) as folder:
                load_hf_into_model(self.states["model"].parts, folder, adapter)
            logger.info(f"checkpoint: initial weights from Hugging Face folder {path}")
            return 0
        checkpoint = checkpoint_location(path)
        meta = read_meta(checkpoint)
        check_fingerprint(checkpoint, meta, self.fingerprint, cfg.check_fingerprint)
        self._check_imported_model(checkpoint, meta)
        model_only = cfg.initial_load_model_only or meta.get("model_only", False)
        names = ["model"] if model_only else [n for n in self.states if n not in cfg.exclude_from_loading]
        load_states(checkpoint, meta, self.states, names, group=self._pg, verify_checksums=cfg.verify_checksums)
        return 0 if model_only else int(meta.get("step", 0))

    # ---- export -------------------------------------------------------------------------------------

    def export(self, out: str | os.PathLike, *, step: int | None = None, **kwargs: Any) -> Path | str:
        """Rank 0 writes the checkpoint of `step` (default: the latest) in Hugging Face layout to `out`;
        kwargs go to export_safetensors (dtype, max_shard_size, tokenizer). Call on every rank."""
        self.wait()
        self._barrier()
        checkpoint = step_dir(self._location, step) if step is not None else checkpoint_location(self._location)
        if self.rank == 0:
            adapter = self.hf_adapter or adapter_from_meta(read_meta(checkpoint))
            export_safetensors(checkpoint, out, adapter=adapter, **kwargs)
        self._barrier()
        return as_location(out).plain
