"""Checks across fields, run before any process group, model or data exists."""

import importlib.util

from titan_train.config.loader import ConfigError, did_you_mean
from titan_train.config.sections import JobConfig


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def validate(config: JobConfig) -> None:
    """Raise ConfigError for the first value that cannot work, naming the field and what is allowed."""
    t, o, s, p = config.training, config.optimizer, config.lr_scheduler, config.parallelism
    _require(t.steps >= 1, f"training.steps={t.steps} must be >= 1")
    _require(t.local_batch_size >= 1, f"training.local_batch_size={t.local_batch_size} must be >= 1")
    _require(
        t.global_batch_size == -1 or t.global_batch_size >= 1,
        f"training.global_batch_size={t.global_batch_size} must be >= 1, "
        "or -1 for local_batch_size x data-parallel degree",
    )
    _require(t.seq_len >= 2, f"training.seq_len={t.seq_len} must be >= 2")
    _require(t.max_norm >= 0, f"training.max_norm={t.max_norm} must be >= 0 (0 turns clipping off)")
    _require(t.dataloader_num_workers >= 0, f"training.dataloader_num_workers={t.dataloader_num_workers} must be >= 0")
    _require(o.lr > 0, f"optimizer.lr={o.lr} must be > 0")
    for name in ("beta1", "beta2"):
        beta = getattr(o, name)
        _require(0 <= beta < 1, f"optimizer.{name}={beta} must be in [0, 1)")
    _require(o.eps > 0, f"optimizer.eps={o.eps} must be > 0")
    _require(o.weight_decay >= 0, f"optimizer.weight_decay={o.weight_decay} must be >= 0")
    _require(s.warmup_steps >= 0, f"lr_scheduler.warmup_steps={s.warmup_steps} must be >= 0")
    _require(0 <= s.decay_ratio <= 1, f"lr_scheduler.decay_ratio={s.decay_ratio} must be in [0, 1]")
    _require(0 <= s.min_lr_factor <= 1, f"lr_scheduler.min_lr_factor={s.min_lr_factor} must be in [0, 1]")
    _require(config.metrics.log_freq >= 1, f"metrics.log_freq={config.metrics.log_freq} must be >= 1")
    _require(all(r >= 0 for r in config.metrics.ranks), f"metrics.ranks={config.metrics.ranks} must be ranks >= 0")
    prof = config.profiling
    for name in ("profile_freq", "profile_active", "memory_snapshot_freq"):
        _require(getattr(prof, name) >= 1, f"profiling.{name}={getattr(prof, name)} must be >= 1")
    _require(
        prof.profile_warmup >= 0 and prof.profile_warmup + prof.profile_active <= prof.profile_freq,
        f"profiling.profile_warmup={prof.profile_warmup} + profiling.profile_active={prof.profile_active} must be "
        f"<= profiling.profile_freq={prof.profile_freq} (warmup >= 0)",
    )
    for name in ("init_timeout_seconds", "train_timeout_seconds"):
        _require(getattr(config.comm, name) > 0, f"comm.{name}={getattr(config.comm, name)} must be > 0")
    _require(config.comm.trace_buf_size >= 0, f"comm.trace_buf_size={config.comm.trace_buf_size} must be >= 0")
    for name in (
        "data_parallel_replicate_degree",
        "tensor_parallel_degree",
        "pipeline_parallel_degree",
        "context_parallel_degree",
        "pipeline_parallel_microbatch_size",
    ):
        value = getattr(p, name)
        _require(value >= 1, f"parallelism.{name}={value} must be >= 1")
    _require(
        p.pipeline_parallel_layers_per_stage >= 0,
        f"parallelism.pipeline_parallel_layers_per_stage={p.pipeline_parallel_layers_per_stage} must be >= 1, "
        "or 0 for one stage per rank",
    )
    _require(
        p.data_parallel_shard_degree == -1 or p.data_parallel_shard_degree >= 1,
        f"parallelism.data_parallel_shard_degree={p.data_parallel_shard_degree} must be >= 1, "
        "or -1 for the rest of the world",
    )
    for section in (config.checkpoint, config.float8):
        try:
            section.validate()
        except ValueError as e:
            raise ConfigError(str(e)) from None
    _validate_switched_off_values(config)
    if config.metrics.enable_wandb:
        _require(
            importlib.util.find_spec("wandb") is not None,
            "metrics.enable_wandb=true needs the wandb package: pip install 'titan-debug[wandb]' (or set it to false)",
        )
    _validate_model(config)
    _validate_inputs(config)
    _validate_documents_and_validation(config)


def _validate_switched_off_values(config: JobConfig) -> None:
    """Values of features that are off are checked too: a typo is a typo, and it would surface only on the day
    the feature is turned on, far from where it was written."""
    from titan_parallel import SCHEDULES, ActivationCheckpoint

    schedule = config.parallelism.pipeline_parallel_schedule
    if schedule.lower() not in {name.lower() for name in SCHEDULES}:
        raise ConfigError(
            f"parallelism.pipeline_parallel_schedule={schedule!r} is unknown; use one of {', '.join(SCHEDULES)}"
            f"{did_you_mean(schedule, SCHEDULES)}"
        )
    option = str(config.activation_checkpoint.selective_ac_option)
    try:
        ActivationCheckpoint("selective", option)
    except ValueError:
        raise ConfigError(
            f"activation_checkpoint.selective_ac_option={option!r} is not supported; use 'op' (per-op selective "
            "AC) or a positive integer N as a string (checkpoint every N-th block)"
        ) from None


def _validate_model(config: JobConfig) -> None:
    from titan_models import get_model_spec

    try:
        spec = get_model_spec(config.model.name)
    except ValueError as e:
        raise ConfigError(f"model.name: {e}") from None
    try:
        spec.args_for(config.model.flavor)
    except ValueError as e:
        raise ConfigError(f"model.flavor: {e}") from None


def _validate_inputs(config: JobConfig) -> None:
    """The dataset and tokenizer exist; the first record of each data file is read (data/checks.py)."""
    from pathlib import Path

    from titan_train.data import check_dataset, resolve_dataset

    t = config.training
    path = config.model.tokenizer_path
    if path and not (Path(path).expanduser().is_file() or (Path(path).expanduser() / "tokenizer.json").is_file()):
        raise ConfigError(
            f"model.tokenizer_path={path!r}: no tokenizer.json there; give a tokenizer.json, a folder holding one "
            "(Hugging Face layout), or leave it empty for the tokenizer shipped with titan-train"
        )
    try:
        check_dataset(resolve_dataset(t.dataset, t.dataset_path, t.dataset_text_field, t.dataset_mixture), path)
    except (ValueError, ImportError) as e:
        raise ConfigError(str(e)) from None


def _validate_documents_and_validation(config: JobConfig) -> None:
    from titan_train.data.documents import check_document_masking
    from titan_train.run.validation import check_validation

    check_document_masking(config)
    check_validation(config)
