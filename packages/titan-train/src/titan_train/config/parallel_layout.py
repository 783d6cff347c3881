"""The run's layout: every decision about how the model is parallelized, resolved from the config and the
world size before any process group exists, into titan_parallel's frozen `Layout`.

This is the one place that knows both the config keys and the libraries: library errors speak in their own
parameter names (`schedule=`, `pp_degree=`, `tp=`), and `_config_error` says them again in the config's keys.
Checks that do not depend on the world size run first, so a degree that cannot fit the model is reported as
such, not as a world-size mismatch.
"""

import logging
import os
import re

import torch

from titan_models import get_model_spec
from titan_parallel import (
    ACGranularity,
    ActivationCheckpoint,
    ContextParallel,
    DataParallel,
    Layout,
    ParallelDims,
    SimpleFSDPOptions,
    check_tp_degree,
    device_type,
    plan_pipeline,
    symmetric_memory_unavailable,
)
from titan_train.config import ConfigError, JobConfig

logger = logging.getLogger("titan")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# Library parameter names -> the config keys that set them; and settings a library suggests as a whole.
_CONFIG_KEYS = {
    "schedule": "parallelism.pipeline_parallel_schedule",
    "pp_degree": "parallelism.pipeline_parallel_degree",
    "layers_per_stage": "parallelism.pipeline_parallel_layers_per_stage",
    "stage_blocks": "parallelism.pipeline_parallel_stage_blocks",
    "local_batch_size": "training.local_batch_size",
    "microbatch_size": "parallelism.pipeline_parallel_microbatch_size",
    "mode": "activation_checkpoint.mode",
    "selective_option": "activation_checkpoint.selective_ac_option",
    "dp_replicate": "parallelism.data_parallel_replicate_degree",
    "dp_shard": "parallelism.data_parallel_shard_degree",
    "cp": "parallelism.context_parallel_degree",
    "tp": "parallelism.tensor_parallel_degree",
    "pp": "parallelism.pipeline_parallel_degree",
}
_SETTINGS = {
    "compiled=False": "compile.enable=false",
    "op_level_ac=False": "activation_checkpoint.mode='full' or a selective every-N option",
}


def _config_error(error: ValueError) -> ConfigError:
    """The library's message in the config's words: its parameter names replaced by the config keys."""
    message = str(error)
    for setting, config_setting in _SETTINGS.items():
        message = message.replace(setting, config_setting)

    def key(match: re.Match) -> str:
        name, assigned = match.group(1), match.group(2)
        # A one-word name ("schedule") is a parameter only where a value is assigned to it; elsewhere prose.
        return _CONFIG_KEYS[name] + assigned if assigned or "_" in name else match.group(0)

    names = "|".join(_CONFIG_KEYS)
    return ConfigError(re.sub(rf"(?<![\w.])({names})(?![\w.])(=?)", key, message))


def resolve_layout(config: JobConfig, world_size: int) -> Layout:
    p, t = config.parallelism, config.training
    spec = get_model_spec(config.model.name)
    plan = spec.plan(spec.args_for(config.model.flavor))
    # First what the config must satisfy on any number of processes.
    _check_model_fit(config, plan)
    _check_simple_fsdp(config)
    ac = _ac(config)
    _check_compiled_block_ac(config, ac)
    pp = p.pipeline_parallel_degree
    pipeline = _pipeline_plan(config, pp, plan.block_fqns, ac) if pp > 1 else None
    # Then what depends on how many processes were launched.
    dims = _parallel_dims(config, world_size)
    if config.checkpoint.create_seed_checkpoint and world_size > 1:
        raise ConfigError(
            f"checkpoint.create_seed_checkpoint runs on one process (world size is {world_size}); "
            "run it without torchrun, then launch the parallel run from that folder"
        )
    per_step = t.local_batch_size * dims.dp
    global_batch = per_step if t.global_batch_size == -1 else t.global_batch_size
    if global_batch % per_step:
        # With data_parallel_shard_degree = -1 the degree follows the world size: an elastic restart on
        # another number of processes can make a global batch that fitted before stop fitting.
        elastic = (
            f" (parallelism.data_parallel_shard_degree=-1 gives degree {dims.dp} on {world_size} processes; a "
            "global batch that fits every world size the job may restart on keeps the optimization unchanged)"
            if p.data_parallel_shard_degree == -1 and world_size > 1
            else ""
        )
        raise ConfigError(
            f"training.global_batch_size={global_batch} is not a multiple of training.local_batch_size="
            f"{t.local_batch_size} x data-parallel degree {dims.dp} = {per_step}; use a multiple of {per_step}"
            f"{elastic}"
        )
    data_parallel = _data_parallel(config, dims)
    return Layout(
        dims=dims,
        accumulation_steps=global_batch // per_step,
        data_parallel=data_parallel,
        param_dtype=DTYPES[t.mixed_precision_param],
        reduce_dtype=DTYPES[t.mixed_precision_reduce],
        reshard_after_forward=p.fsdp_reshard_after_forward,
        simple_fsdp=_simple_fsdp_options(config, dims) if data_parallel is DataParallel.SIMPLE_FSDP else None,
        loss_parallel=dims.tp > 1 and p.enable_loss_parallel,
        async_tensor_parallel=_async_tensor_parallel(config, dims.tp),
        loss_chunk_tokens=t.loss_chunk_tokens,
        activation_checkpoint=ac,
        compile_backend=config.compile.backend if config.compile.enable else None,
        pipeline=pipeline,
        context_parallel=(
            ContextParallel(p.context_parallel_variant, p.context_parallel_implementation, t.seq_len)
            if dims.cp > 1
            else None
        ),
    )


def _async_tensor_parallel(config: JobConfig, tp: int) -> str | None:
    """The async TP implementation this run uses, or None; "symmetric_memory" only where it can run."""
    p = config.parallelism
    if not p.enable_async_tensor_parallel or tp == 1:
        return None
    asked = p.async_tensor_parallel_implementation
    backend = config.compile.backend if config.compile.enable else None
    gpus = torch.cuda.device_count() if device_type() == "cuda" else 0
    gpus = min(gpus, int(os.environ.get("LOCAL_WORLD_SIZE", gpus) or gpus))  # ranks this node runs
    reason = symmetric_memory_unavailable(device_type(), backend, tp, gpus)
    if asked == "symmetric_memory" and reason is not None:
        raise ConfigError(
            f"parallelism.async_tensor_parallel_implementation='symmetric_memory' cannot run here: {reason} "
            "(compile.enable=true, compile.backend='inductor', parallelism.tensor_parallel_degree at most the "
            "GPUs per node); use async_tensor_parallel_implementation='titan' or 'auto'"
        )
    chosen = ("titan" if reason is not None else "symmetric_memory") if asked == "auto" else asked
    if chosen == "titan" and config.compile.enable:
        logger.info(
            "async TP: Titan's implementation with compile.enable=true: each block compiles in pieces, the "
            "async layers running eagerly between them"
            + (f" (torch's symmetric_memory cannot run here: {reason})" if asked == "auto" else "")
        )
    return chosen


def _check_model_fit(config: JobConfig, plan) -> None:
    """The degrees that split the model or the sequence fit this model and sequence length."""
    p, model, seq_len = config.parallelism, config.model, config.training.seq_len
    cp, tp = p.context_parallel_degree, p.tensor_parallel_degree
    chunk = config.training.loss_chunk_tokens
    if chunk < 0:
        raise ConfigError(f"training.loss_chunk_tokens={chunk} must be >= 0 (0: the plain loss)")
    if chunk and not plan.head_fqn:
        raise ConfigError(
            f"training.loss_chunk_tokens={chunk}: model.name={model.name!r} declares no output head to chunk; use 0"
        )
    if cp > 1 and not plan.context_parallel:
        raise ConfigError(
            f"parallelism.context_parallel_degree={cp}: model.name={model.name!r} has no attention "
            "to run as ring attention; use 1"
        )
    if cp > 1 and seq_len % (2 * cp):
        raise ConfigError(
            f"training.seq_len={seq_len} is not divisible by 2 x parallelism.context_parallel_degree = "
            f"{2 * cp} (each rank holds two load-balanced chunks); use a multiple of {2 * cp}"
        )
    if tp > 1:
        try:
            check_tp_degree(tp, plan.tp_divisible)
        except ValueError as e:
            message = str(e)
            for name, size in plan.tp_divisible.items():  # sizes of the flavor, not keys a user can set
                short = name.removeprefix("model.")
                message = message.replace(f"{name}={size}", f"{short}={size} (model.flavor={model.flavor!r})")
            raise ConfigError(message) from None


def _parallel_dims(config: JobConfig, world_size: int) -> ParallelDims:
    p = config.parallelism
    degrees = dict(
        dp_replicate=p.data_parallel_replicate_degree,
        dp_shard=p.data_parallel_shard_degree,
        cp=p.context_parallel_degree,
        tp=p.tensor_parallel_degree,
        pp=p.pipeline_parallel_degree,
    )
    try:
        return ParallelDims(**degrees, world_size=world_size)
    except ValueError as e:
        others = degrees["dp_replicate"] * degrees["cp"] * degrees["tp"] * degrees["pp"]
        if degrees["dp_shard"] == -1:
            fits = [n for n in range(1, world_size + 1) if world_size % n == 0]
            fix = f"choose degrees whose product divides the world size (its divisors: {', '.join(map(str, fits))})"
        else:
            fix = (
                f"set parallelism.data_parallel_shard_degree=-1 to shard over the rest, or launch "
                f"{others * degrees['dp_shard']} processes"
            )
        raise ConfigError(f"{_config_error(e)}; {fix}") from None


def _data_parallel(config: JobConfig, dims: ParallelDims) -> DataParallel:
    sharded, replicated = dims.degree("dp_shard_cp") > 1, dims.dp_replicate > 1
    if not (sharded or replicated):
        return DataParallel.NONE
    if config.parallelism.fsdp_implementation == "simple_fsdp":
        return DataParallel.SIMPLE_FSDP  # every data-parallel layout: sharded, replicated or both
    return DataParallel.FSDP2 if sharded else DataParallel.DDP


def _simple_fsdp_options(config: JobConfig, dims: ParallelDims) -> SimpleFSDPOptions:
    p = config.parallelism
    if dims.degree("dp_shard_cp") > 1:
        mode = "hybrid_shard" if dims.dp_replicate > 1 else "fully_shard"
    else:
        mode = "replicate"
    if p.simple_fsdp_overlap == "bucket_reorder" and config.training.deterministic:
        # Deterministic algorithms set inductor's `deterministic`, which skips its reordering pass: the
        # overlap asked for would silently not happen.
        raise ConfigError(
            "parallelism.simple_fsdp_overlap='bucket_reorder' with training.deterministic=true: inductor skips "
            "its compute/communication reordering in deterministic mode; use simple_fsdp_overlap='bucket' or "
            "training.deterministic=false"
        )
    return SimpleFSDPOptions(mode, p.simple_fsdp_overlap, tuple(p.simple_fsdp_manual_buckets))


def _ac(config: JobConfig) -> ActivationCheckpoint:
    ac, p, t = config.activation_checkpoint, config.parallelism, config.training
    if ac.mode != "auto":
        try:
            return ActivationCheckpoint(ac.mode, str(ac.selective_ac_option))
        except ValueError as e:
            raise _config_error(e) from None
    if ac.memory_budget_gib < 0 or (ac.memory_budget_gib == 0 and device_type() == "cpu"):
        raise ConfigError(
            f"activation_checkpoint.memory_budget_gib={ac.memory_budget_gib}: mode='auto' needs a budget in GiB "
            "(0 means the GPU's capacity, which a CPU run does not have); give e.g. 70"
        )
    # The step auto traces: one micro-batch of this rank's tokens.
    sequences = p.pipeline_parallel_microbatch_size if p.pipeline_parallel_degree > 1 else t.local_batch_size
    compiled_dtensor_blocks = config.compile.enable and (
        p.tensor_parallel_degree > 1 or p.fsdp_implementation == "simple_fsdp"
    )
    return ActivationCheckpoint(
        "auto",
        memory_budget_gib=ac.memory_budget_gib,
        trace_batch=(sequences, t.seq_len // p.context_parallel_degree),
        # Whole-block checkpoints of compiled blocks fail with DTensor parameters (_check_compiled_block_ac).
        auto_policies=("none", "op") if compiled_dtensor_blocks else ("none", "op", "full"),
        optimizer_bytes_per_param=8,  # AdamW's exp_avg and exp_avg_sq in float32
    )


def _check_compiled_block_ac(config: JobConfig, ac: ActivationCheckpoint) -> None:
    """Compiled whole-block checkpoints fail in AOTAutograd when parameters are DTensors (it saves DTensor
    mesh metadata for backward): tensor parallel and SimpleFSDP both make them so."""
    if not config.compile.enable or ac.granularity is not ACGranularity.BLOCK:
        return
    simple = config.parallelism.fsdp_implementation == "simple_fsdp"
    tp = config.parallelism.tensor_parallel_degree
    if tp > 1:
        cause = f"tensor parallel (parallelism.tensor_parallel_degree={tp})"
    elif simple:
        cause = "simple_fsdp (parallelism.fsdp_implementation='simple_fsdp')"
    else:
        return
    raise ConfigError(
        f"activation_checkpoint.mode={config.activation_checkpoint.mode!r} checkpoints whole blocks, which torch "
        f"{torch.__version__} cannot compile (compile.enable=true) with the DTensor parameters of {cause}; use "
        "activation_checkpoint.mode='selective' with selective_ac_option='op', or compile.enable=false"
        + (", or parallelism.fsdp_implementation='fsdp2'" if tp == 1 else "")
    )


def _check_simple_fsdp(config: JobConfig) -> None:
    p = config.parallelism
    simple = p.fsdp_implementation == "simple_fsdp"
    if p.simple_fsdp_overlap != "none" and not (simple and config.compile.enable):
        raise ConfigError(
            f"parallelism.simple_fsdp_overlap={p.simple_fsdp_overlap!r} reorders the collectives of compiled "
            "blocks; it needs parallelism.fsdp_implementation='simple_fsdp' and compile.enable=true"
        )
    if not simple:
        return
    if config.float8.enable:
        raise ConfigError(
            "float8.enable=true is not supported with parallelism.fsdp_implementation='simple_fsdp' (float8 "
            "weights are not gathered through its parametrization); use fsdp_implementation='fsdp2'"
        )


def _pipeline_plan(config: JobConfig, pp: int, block_fqns: list[str], ac: ActivationCheckpoint):
    p = config.parallelism
    try:
        return plan_pipeline(
            p.pipeline_parallel_schedule,
            pp,
            block_fqns,
            config.training.local_batch_size,
            p.pipeline_parallel_microbatch_size,
            layers_per_stage=p.pipeline_parallel_layers_per_stage or None,
            stage_blocks=[entry.split() for entry in p.pipeline_parallel_stage_blocks] or None,
            compiled=config.compile.enable,
            op_level_ac=ac.granularity is ACGranularity.OP or "op" in (ac.auto_policies if ac.mode == "auto" else ()),
        )
    except ValueError as e:
        raise _config_error(e) from None
