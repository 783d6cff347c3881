"""A run records itself in its dump folder, before any process group exists (rank 0 writes):

    <dump_folder>/config.toml   the resolved config of the latest start (`titan-train --config` takes it back)
    <dump_folder>/run.json      {"run_id", "restart", "starts": [{"restart", "time", "world_size", "changed"}]}

A start that resumes from a checkpoint of this folder continues the recorded run: same run id, restart
counter + 1. So does a replica group that torchrun restarted (fault_tolerance.enable): it heals from a live
group, or resumes from the job's checkpoint, and goes on with the job's steps either way. Its config is
compared with the record first: a changed value that would break the resume (another model, vocabulary,
sequence length or data; `BREAKING`) is a ConfigError naming the key and both values; any other change (lr,
steps, log_freq, layout, ...) is a warning and is listed in run.json.
A start with nothing to resume is a new run (new id, restart 0); a differing record it replaces is kept as
`config.<old run id>.toml`, and the warning says so. metrics.jsonl rows carry `run_id` and `restart`, so the
rows of resumed and repeated runs appended to one file stay apart.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import secrets
import tomllib
from dataclasses import dataclass
from pathlib import Path

from titan_checkpoint import complete_steps
from titan_train.config import ConfigError, JobConfig, to_toml
from titan_train.run.checkpointing import resolve_folder

logger = logging.getLogger("titan")

CONFIG_FILE, RUN_FILE = "config.toml", "run.json"

# Keys a resume cannot change, and why: the checkpoint or the data position would mean something else.
BREAKING = {
    "model.name": "the checkpoint holds another model's weights",
    "model.flavor": "the checkpoint's tensors have other shapes",
    "model.tokenizer_path": "token ids would stand for other tokens than the ones trained on (vocabulary)",
    "training.seq_len": "the data loader's saved position counts sequences of the recorded length",
    "training.dataset": "the data loader's saved position is a position in the recorded dataset",
    "training.dataset_path": "the data loader's saved position is a position in the recorded dataset",
    "training.data_order": "the data loader's saved position is one of the recorded data order",
    "optimizer.name": "the checkpoint's optimizer state belongs to the recorded optimizer",
}
# Keys that differ between starts of one run by design.
IGNORED = {"job.dump_folder", "checkpoint.create_seed_checkpoint"}


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    restart: int

    def fields(self) -> dict:
        """What every metrics.jsonl row carries."""
        return {"run_id": self.run_id, "restart": self.restart}


def record_run(config: JobConfig, rank: int | None = None, world_size: int | None = None) -> RunRecord | None:
    """Write (rank 0) or refuse (ConfigError) the run's record; None on other ranks, which write nothing."""
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    if rank != 0:
        return None
    world_size = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
    dump = Path(config.job.dump_folder)
    config_file, run_file = dump / CONFIG_FILE, dump / RUN_FILE
    text = to_toml(config)
    previous = _read_previous(config_file, run_file)
    changed: dict[str, list] = {}
    if previous is not None and (will_resume(config) or will_heal(config)):
        old_config, old_run = previous
        changed = config_changes(old_config, _flat(tomllib.loads(text)))
        _refuse_breaking(changed, config_file)
        if changed:
            listed = ", ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in changed.items())
            logger.warning(f"resuming run {old_run['run_id']} with a changed config (recorded in {run_file}): {listed}")
        record = RunRecord(old_run["run_id"], int(old_run.get("restart", 0)) + 1)
        starts = list(old_run.get("starts", []))
    else:
        record = RunRecord(new_run_id(), 0)
        starts = []
        if previous is not None:
            _keep_replaced_record(config_file, run_file, previous, text, record)
    starts.append({"restart": record.restart, "time": _now(), "world_size": world_size, "changed": changed})
    dump.mkdir(parents=True, exist_ok=True)
    _write_atomically(config_file, text)
    _write_atomically(run_file, json.dumps({**record.fields(), "starts": starts}, indent=1) + "\n")
    logger.info(f"run {record.run_id}, restart {record.restart}: config recorded in {config_file}")
    return record


def will_resume(config: JobConfig) -> bool:
    """Whether this start loads a checkpoint of its own folder (what the trainer's checkpoint manager does)."""
    ckpt = config.checkpoint
    if not ckpt.enable or ckpt.create_seed_checkpoint:
        return False
    return bool(complete_steps(resolve_folder(config, ckpt.folder)))


def will_heal(config: JobConfig) -> bool:
    """Whether this start is a replica group that torchrun restarted: it continues the job (heals from a live
    group, or loads the job's checkpoint), whatever its own folder holds."""
    return config.fault_tolerance.enable and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0


def config_changes(recorded: dict, current: dict) -> dict[str, list]:
    """{"section.key": [recorded, current]} for every key both hold with different values (keys one of them
    lacks come from another titan-train version and are not compared)."""
    return {
        key: [recorded[key], value]
        for key, value in current.items()
        if key in recorded and key not in IGNORED and recorded[key] != value
    }


def new_run_id() -> str:
    """Sortable by start time, unique across machines: 20260101-120000-1a2b3c."""
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def _refuse_breaking(changed: dict[str, list], config_file: Path) -> None:
    breaking = [key for key in changed if key in BREAKING]
    if not breaking:
        return
    reasons = "; ".join(
        f"{key}={changed[key][1]!r} but the run was recorded with {key}={changed[key][0]!r} ({BREAKING[key]})"
        for key in breaking
    )
    raise ConfigError(
        f"cannot resume the run recorded in {config_file}: {reasons}. Restore the recorded value, or start a new "
        "run in another job.dump_folder"
    )


def _read_previous(config_file: Path, run_file: Path) -> tuple[dict, dict] | None:
    if not config_file.is_file():
        return None
    try:
        recorded = _flat(tomllib.loads(config_file.read_text()))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(
            f"{config_file} (the record of an earlier run) is not valid TOML: {e}; repair or remove it"
        ) from None
    try:
        run = json.loads(run_file.read_text()) if run_file.is_file() else {}
    except ValueError:
        run = {}
    if not isinstance(run, dict) or not isinstance(run.get("run_id"), str):
        run = {"run_id": "unrecorded", "restart": 0}  # a record written by hand, or a damaged run.json
    return recorded, run


def _keep_replaced_record(config_file: Path, run_file: Path, previous: tuple[dict, dict], text: str, new) -> None:
    old_config, old_run = previous
    if old_config == _flat(tomllib.loads(text)):
        return  # the same config: the old record says nothing the new one does not
    kept = config_file.with_name(f"config.{old_run['run_id']}.toml")
    os.replace(config_file, kept)
    if run_file.is_file():
        os.replace(run_file, run_file.with_name(f"run.{old_run['run_id']}.json"))
    logger.warning(
        f"{config_file.parent} held run {old_run['run_id']} with another config and no checkpoint to resume; "
        f"starting run {new.run_id}; the earlier record is kept as {kept}"
    )


def _flat(toml: dict) -> dict:
    return {f"{section}.{key}": value for section, values in toml.items() for key, value in values.items()}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
