"""Checks across fields, run before any process group, model or data exists."""

import importlib.util

from titan_debug import DEVICES
from titan_train.config.loader import ConfigError, did_you_mean
from titan_train.config.sections import JobConfig
from titan_train.config.validate_chat import validate_chat


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
    _require(o.muon_lr > 0, f"optimizer.muon_lr={o.muon_lr} must be > 0")
    _require(o.muon_weight_decay >= 0, f"optimizer.muon_weight_decay={o.muon_weight_decay} must be >= 0")
    _require(0 <= o.muon_momentum < 1, f"optimizer.muon_momentum={o.muon_momentum} must be in [0, 1)")
    _require(1 <= o.muon_ns_steps < 100, f"optimizer.muon_ns_steps={o.muon_ns_steps} must be in 1..99")
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
    _require(
        not config.dry_run.gpu or config.dry_run.gpu in DEVICES,
        f"dry_run.gpu={config.dry_run.gpu!r} is not a known GPU; use one of {', '.join(DEVICES)} (or empty for "
        "the default)",
    )
    for section in (config.checkpoint, config.float8):
        try:
            section.validate()
        except ValueError as e:
            raise ConfigError(str(e)) from None
    _require(t.mtp_loss_weight >= 0, f"training.mtp_loss_weight={t.mtp_loss_weight} must be >= 0")
    _require(t.mtp_loss_weight_late >= 0, f"training.mtp_loss_weight_late={t.mtp_loss_weight_late} must be >= 0")
    _require(
        t.mtp_loss_weight_after >= 0,
        f"training.mtp_loss_weight_after={t.mtp_loss_weight_after} must be >= 0 (a step; 0: lambda never changes)",
    )
    _validate_switched_off_values(config)
    if config.metrics.enable_wandb:
        _require(
            importlib.util.find_spec("wandb") is not None,
            "metrics.enable_wandb=true needs the wandb package: pip install 'titan-debug[wandb]' (or set it to false)",
        )
    _validate_model(config)
    _validate_inputs(config)
    _validate_document_masking(config)
    validate_chat(config)
    _validate_validation(config)
    _validate_fault_tolerance(config)
    _validate_lora(config)
    _validate_muon_clip(config)


def _validate_switched_off_values(config: JobConfig) -> None:
    """Values of features that are off are checked too: a typo is a typo, and it would surface only on the day
    the feature is turned on, far from where it was written."""
    from titan_parallel import SCHEDULES, check_ac_options, option_names
    from titan_train.config.parallel_layout import PARALLEL_OPTION_KEYS

    schedule = config.parallelism.pipeline_parallel_schedule
    if schedule.lower() not in {name.lower() for name in SCHEDULES}:
        raise ConfigError(
            f"parallelism.pipeline_parallel_schedule={schedule!r} is unknown; use one of {', '.join(SCHEDULES)}"
            f"{did_you_mean(schedule, SCHEDULES)}"
        )
    try:
        with option_names(PARALLEL_OPTION_KEYS):
            check_ac_options(config.activation_checkpoint.mode, str(config.activation_checkpoint.selective_ac_option))
    except ValueError as e:
        raise ConfigError(str(e)) from None


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

    from titan_models import get_model_spec
    from titan_train.data import check_dataset, resolve_dataset
    from titan_train.data.tokenizer import load_tokenizer

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
    vocab = get_model_spec(config.model.name).args_for(config.model.flavor).vocab_size
    tokens = load_tokenizer(path or None).vocab_size
    if tokens > vocab:
        raise ConfigError(
            f"the tokenizer has {tokens} tokens but model.flavor={config.model.flavor!r} has vocab_size={vocab}; "
            "use a flavor with a larger vocabulary or a smaller tokenizer (model.tokenizer_path)"
        )


def _validate_document_masking(config: JobConfig) -> None:
    """Refuse, before anything is built, what cannot carry document masking."""
    from titan_models import get_model_spec

    m, p = config.model, config.parallelism
    if m.attention_mask == "causal" and m.positions == "sequence":
        return
    spec = get_model_spec(m.name)
    if not spec.plan(spec.args_for(m.flavor)).document_masking:
        raise ConfigError(
            f"model.attention_mask={m.attention_mask!r} / model.positions={m.positions!r}: model.name={m.name!r} "
            "takes no document ids or per-document positions; use model.attention_mask='causal' and "
            "model.positions='sequence'"
        )
    torch_ring = p.context_parallel_degree > 1 and p.context_parallel_implementation == "torch"
    if m.attention_mask == "block_causal" and torch_ring:
        raise ConfigError(
            "model.attention_mask='block_causal' with context parallelism needs "
            "parallelism.context_parallel_implementation='titan' (torch's ring takes no document mask)"
        )


def _validate_validation(config: JobConfig) -> None:
    """Refuse a `[validation]` that cannot run, before anything is built (checked even when off: a typo is
    a typo)."""
    v, t, p = config.validation, config.training, config.parallelism
    if v.freq < 1:
        raise ConfigError(f"validation.freq={v.freq} must be >= 1 (steps between evaluations)")
    if v.steps == 0 or v.steps < -1:
        raise ConfigError(f"validation.steps={v.steps} must be >= 1, or -1 for the whole dataset once")
    for key in ("local_batch_size", "seq_len"):
        value = getattr(v, key)
        if value == 0 or value < -1:
            raise ConfigError(f"validation.{key}={value} must be >= 1, or -1 for training.{key}")
    if not v.enable:
        return
    if p.pipeline_parallel_degree > 1:
        from titan_parallel import SCHEDULES

        schedule = next((s for s in SCHEDULES if s.lower() == p.pipeline_parallel_schedule.lower()), None)
        if schedule is not None and SCHEDULES[schedule] == "v":
            forward_only = ", ".join(s for s, shape in SCHEDULES.items() if shape != "v")
            raise ConfigError(
                f"validation.enable=true with parallelism.pipeline_parallel_schedule={schedule!r}: torch 2.13 has "
                f"no forward-only pass for V-shaped schedules; use one of {forward_only}, or validation.enable=false"
            )
    if p.pipeline_parallel_degree > 1 and v.local_batch_size not in (-1, t.local_batch_size):
        raise ConfigError(
            f"validation.local_batch_size={v.local_batch_size} differs from training.local_batch_size="
            f"{t.local_batch_size}; with pipeline parallelism the schedule's micro-batches are fixed: set it to -1"
        )
    if p.context_parallel_degree > 1 and v.seq_len not in (-1, t.seq_len):
        raise ConfigError(
            f"validation.seq_len={v.seq_len} differs from training.seq_len={t.seq_len}; with context "
            "parallelism each rank's positions are fixed: set it to -1"
        )
    from titan_train.data import resolve_dataset
    from titan_train.data.dataset_keys import DatasetKeys

    try:
        keys = DatasetKeys("validation.dataset", "validation.dataset_path", "training.dataset_text_field")
        resolve_dataset(v.dataset, v.dataset_path, t.dataset_text_field, keys=keys)
    except (ValueError, ImportError) as e:
        raise ConfigError(f"validation: {e}") from None


def _validate_fault_tolerance(config: JobConfig) -> None:
    """Replica groups (torchft): ids, sizes and the lighthouse, checked before any process starts talking."""
    import os

    ft = config.fault_tolerance
    for key in ("sync_steps", "min_replica_size", "timeout_seconds"):
        value = getattr(ft, key)
        _require(value >= 1, f"fault_tolerance.{key}={value} must be >= 1")
    _require(ft.outer_lr > 0, f"fault_tolerance.outer_lr={ft.outer_lr} must be > 0")
    _require(0 <= ft.outer_momentum < 1, f"fault_tolerance.outer_momentum={ft.outer_momentum} must be in [0, 1)")
    if not ft.enable:
        return
    _require(
        importlib.util.find_spec("torchft") is not None,
        "fault_tolerance.enable=true needs torchft: pip install 'titan-train[ft]' (or set it to false)",
    )
    _require(
        ft.group_size >= 1,
        f"fault_tolerance.group_size={ft.group_size}: with fault_tolerance.enable=true give the number of replica "
        "groups of the job (>= 1)",
    )
    _require(
        0 <= ft.replica_id < ft.group_size,
        f"fault_tolerance.replica_id={ft.replica_id} must be in [0, fault_tolerance.group_size={ft.group_size})",
    )
    _require(
        ft.min_replica_size <= ft.group_size,
        f"fault_tolerance.min_replica_size={ft.min_replica_size} exceeds fault_tolerance.group_size="
        f"{ft.group_size}: no quorum could ever form; use 1 .. {ft.group_size}",
    )
    _require(
        bool(ft.lighthouse_address or os.environ.get("TORCHFT_LIGHTHOUSE")),
        "fault_tolerance.lighthouse_address is empty and TORCHFT_LIGHTHOUSE is not set: give the address of "
        "torchft_lighthouse (http://host:29510)",
    )
    _require(
        ft.semi_sync_method == "none" or config.parallelism.pipeline_parallel_degree == 1,
        f"fault_tolerance.semi_sync_method={ft.semi_sync_method!r} with parallelism.pipeline_parallel_degree="
        f"{config.parallelism.pipeline_parallel_degree}: torchft's LocalSGD / DiLoCo take one model and one "
        "optimizer, not pipeline stages; use semi_sync_method='none' or pipeline_parallel_degree=1",
    )
    _require(
        config.parallelism.data_parallel_replicate_degree == 1,
        f"parallelism.data_parallel_replicate_degree={config.parallelism.data_parallel_replicate_degree} with "
        "fault_tolerance.enable=true: the replica groups are the replicated dimension; set it to 1 (shard within "
        "a group with data_parallel_shard_degree)",
    )


def _validate_lora(config: JobConfig) -> None:
    lora = config.lora
    _require(lora.rank >= 1, f"lora.rank={lora.rank} must be >= 1")
    _require(lora.alpha > 0, f"lora.alpha={lora.alpha} must be > 0")
    _require(0 <= lora.dropout < 1, f"lora.dropout={lora.dropout} must be in [0, 1)")
    _require(bool(lora.target_modules), "lora.target_modules=[] must name at least one linear layer, e.g. wq,wv")
    _require(
        lora.enable or not lora.initial_adapter_path,
        f"lora.initial_adapter_path={lora.initial_adapter_path!r} with lora.enable=false: set lora.enable=true to "
        "train that adapter (or leave the path empty)",
    )
    if not lora.initial_adapter_path:
        return
    _require(
        config.checkpoint.enable,
        f"lora.initial_adapter_path={lora.initial_adapter_path!r} is loaded where a run's initial weights are, with "
        "checkpointing: set checkpoint.enable=true",
    )
    # The folder against the model's layers is titan_train.lora's check (refuse_mismatched_adapter), made where a
    # run starts: config may not import the lora room.


def _validate_muon_clip(config: JobConfig) -> None:
    """QK-clip (run/qk_clip.py) rescales the query and key projections of a Muon run's softmax attention."""
    from titan_models import get_model_spec

    o, p = config.optimizer, config.parallelism
    key = f"optimizer.muon_clip_threshold={o.muon_clip_threshold}"
    _require(
        o.muon_clip_threshold >= 0,
        f"{key} must be >= 0: a logit threshold such as 100 (Kimi K2's), or 0 to turn QK-clip off",
    )
    if o.muon_clip_threshold == 0:
        return
    _require(
        o.name == "Muon",
        f"{key} is MuonClip's, an option of Muon, but optimizer.name={o.name!r}: set optimizer.name='Muon' or "
        "optimizer.muon_clip_threshold=0",
    )
    _require(
        p.context_parallel_degree == 1 or p.context_parallel_implementation == "titan",
        f"{key} with parallelism.context_parallel_implementation={p.context_parallel_implementation!r}: the largest "
        "logit is scored against every rank's keys, which Titan's ring attention gathers for it and torch's does "
        "not; use context_parallel_implementation='titan' or optimizer.muon_clip_threshold=0",
    )
    _require(
        not config.lora.enable,
        f"{key} with lora.enable=true: the query and key projections QK-clip rescales are LoRA's frozen base; "
        "set optimizer.muon_clip_threshold=0",
    )
    args = get_model_spec(config.model.name).args_for(config.model.flavor)
    _require(
        hasattr(args, "n_heads"),
        f"{key}: model {config.model.name!r} has no softmax attention, so no logit to clip; set "
        "optimizer.muon_clip_threshold=0",
    )
