"""The run's layout: every decision about how the model is parallelized, resolved from the config and the
world size before any process group exists, into titan_parallel's frozen `Layout`.

This is the one place that knows both the config keys and the libraries. titan_parallel's errors name its
own parameters (`schedule=`, `pp_degree=`, `tp=`); `PARALLEL_OPTION_KEYS` says, as data, which config key
sets each, and titan_parallel names the key instead (`option_names`). Checks that do not depend on the world
size run first, so a degree that cannot fit the model is reported as such, not as a world-size mismatch.
"""

import logging
import os

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
    auto_loss_chunk_tokens,
    check_loss_chunking,
    check_tp_degree,
    compiled_block_ac_refusal,
    device_type,
    option_names,
    plan_pipeline,
    symmetric_memory_unavailable,
)
from titan_train.config.loader import ConfigError
from titan_train.config.model_args import model_args
from titan_train.config.sections import JobConfig

logger = logging.getLogger("titan")

# titan_parallel's parameter names -> the config settings that set them, for its error messages.
PARALLEL_OPTION_KEYS = {
    "schedule": "parallelism.pipeline_parallel_schedule",
    "pp_degree": "parallelism.pipeline_parallel_degree",
    "layers_per_stage": "parallelism.pipeline_parallel_layers_per_stage",
    "stage_blocks": "parallelism.pipeline_parallel_stage_blocks",
    "local_batch_size": "training.local_batch_size",
    "microbatch_size": "parallelism.pipeline_parallel_microbatch_size",
    "compiled": "compile.enable",
    "op_level_ac": "activation_checkpoint.selective_ac_option='op'",
    "mode": "activation_checkpoint.mode",
    "selective_option": "activation_checkpoint.selective_ac_option",
    "loss_chunk_tokens": "training.loss_chunk_tokens",
    "dp_replicate": "parallelism.data_parallel_replicate_degree",
    "dp_shard": "parallelism.data_parallel_shard_degree",
    "cp": "parallelism.context_parallel_degree",
    "tp": "parallelism.tensor_parallel_degree",
    "pp": "parallelism.pipeline_parallel_degree",
    "ep": "parallelism.expert_parallel_degree",
}


def resolve_layout(config: JobConfig, world_size: int) -> Layout:
    """The layout this config runs with on `world_size` processes; a ConfigError naming the key otherwise."""
    try:
        with option_names(PARALLEL_OPTION_KEYS):
            return _resolve(config, world_size)
    except ConfigError:
        raise
    except ValueError as e:  # titan_parallel's, already in the config's keys
        raise ConfigError(str(e)) from None


def tokens_per_step(config: JobConfig, layout: Layout) -> int:
    """Tokens of one optimizer step over all data-parallel ranks (the global batch x seq_len)."""
    t = config.training
    return layout.accumulation_steps * t.local_batch_size * layout.dims.dp * t.seq_len


def _resolve(config: JobConfig, world_size: int) -> Layout:
    p, t = config.parallelism, config.training
    spec = get_model_spec(config.model.name)
    args = model_args(config)
    plan = spec.plan(args)
    # First what the config must satisfy on any number of processes.
    _check_model_fit(config, plan)
    _check_expert_parallel(config, plan, args)
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
    # With replica groups (torchft) the global batch is the whole job's: this group trains its share of it.
    groups = config.fault_tolerance.group_size if config.fault_tolerance.enable else 1
    per_step = t.local_batch_size * dims.dp * groups
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
            f"{t.local_batch_size} x data-parallel degree {dims.dp}"
            f"{f' x fault_tolerance.group_size={groups}' if groups > 1 else ''} = {per_step}; use a multiple of "
            f"{per_step}{elastic}"
        )
    data_parallel = _data_parallel(config, dims)
    return Layout(
        dims=dims,
        accumulation_steps=global_batch // per_step,
        data_parallel=data_parallel,
        param_dtype=getattr(torch, t.mixed_precision_param),
        reduce_dtype=getattr(torch, t.mixed_precision_reduce),
        reshard_after_forward=p.fsdp_reshard_after_forward,
        simple_fsdp=_simple_fsdp_options(config, dims) if data_parallel is DataParallel.SIMPLE_FSDP else None,
        loss_parallel=dims.tp > 1 and p.enable_loss_parallel,
        async_tensor_parallel=_local_async_tensor_parallel(config),
        loss_chunk_tokens=_loss_chunk_tokens(config, args, plan),
        loss_chunk_gradients=t.loss_chunk_gradients,
        activation_checkpoint=ac,
        compile_backend=config.compile.backend if config.compile.enable else None,
        pipeline=pipeline,
        context_parallel=(
            ContextParallel(p.context_parallel_variant, p.context_parallel_implementation, t.seq_len)
            if dims.cp > 1
            else None
        ),
    )


def choose_async_tp(config: JobConfig, device: str, gpus_per_node: int, where: str = "here") -> str | None:
    """The async TP implementation a run of `config` uses on `gpus_per_node` GPUs of kind `device` (or None:
    async TP off); `where` names that machine in errors. "auto" picks torch's SymmetricMemory pass where it
    can run (compiled with inductor, the TP group within one node's GPUs), Titan's eager layers elsewhere."""
    p = config.parallelism
    if not p.enable_async_tensor_parallel or p.tensor_parallel_degree == 1:
        return None
    asked = p.async_tensor_parallel_implementation
    backend = config.compile.backend if config.compile.enable else None
    reason = symmetric_memory_unavailable(device, backend, p.tensor_parallel_degree, gpus_per_node)
    if asked == "symmetric_memory" and reason is not None:
        raise ConfigError(
            f"parallelism.async_tensor_parallel_implementation='symmetric_memory' cannot run {where}: {reason} "
            "(compile.enable=true, compile.backend='inductor', parallelism.tensor_parallel_degree at most the "
            "GPUs per node); use async_tensor_parallel_implementation='titan' or 'auto'"
        )
    chosen = ("titan" if reason is not None else "symmetric_memory") if asked == "auto" else asked
    if chosen == "titan" and config.compile.enable:
        logger.info(
            "async TP: Titan's implementation with compile.enable=true: each block compiles in pieces, the "
            "async layers running eagerly between them"
            + (f" (torch's symmetric_memory cannot run {where}: {reason})" if asked == "auto" else "")
        )
    return chosen


def _local_async_tensor_parallel(config: JobConfig) -> str | None:
    """choose_async_tp on this machine: its device and the GPUs this node runs ranks on."""
    gpus = torch.cuda.device_count() if device_type() == "cuda" else 0
    gpus = min(gpus, int(os.environ.get("LOCAL_WORLD_SIZE", gpus) or gpus))
    return choose_async_tp(config, device_type(), gpus)


def _check_model_fit(config: JobConfig, plan) -> None:
    """The degrees that split the model or the sequence fit this model and sequence length."""
    p, model, seq_len = config.parallelism, config.model, config.training.seq_len
    cp, tp = p.context_parallel_degree, p.tensor_parallel_degree
    if config.training.loss_chunk_tokens != "auto":
        check_loss_chunking(config.training.loss_chunk_tokens, plan.head_fqn)
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
        check_tp_degree(tp, plan.tp_divisible, sizes_of=f"model.flavor={model.flavor!r}")


def _check_expert_parallel(config: JobConfig, plan, args) -> None:
    ep, p = config.parallelism.expert_parallel_degree, config.parallelism
    if ep == 1:
        return
    model = config.model
    if not plan.expert_fqns:
        raise ConfigError(
            f"parallelism.expert_parallel_degree={ep}: model.name={model.name!r} flavor {model.flavor!r} has no "
            "routed experts to split; use 1"
        )
    experts = args.moe.num_experts
    if ep < 1 or experts % ep:
        fits = [d for d in range(2, experts + 1) if experts % d == 0]
        raise ConfigError(
            f"parallelism.expert_parallel_degree={ep} does not divide the {experts} experts of model.flavor="
            f"{model.flavor!r}; use one of {fits}"
        )
    if p.fsdp_implementation == "simple_fsdp":
        raise ConfigError(
            f"parallelism.expert_parallel_degree={ep} shards the experts with FSDP2; use "
            "parallelism.fsdp_implementation='fsdp2'"
        )


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
        dims = ParallelDims(**degrees, world_size=world_size)
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
        raise ConfigError(f"{e}; {fix}") from None
    if p.expert_parallel_degree == 1:
        return dims
    try:  # apart: the fixes above are about the world size, an expert-parallel degree names its own
        return ParallelDims(**degrees, world_size=world_size, ep=p.expert_parallel_degree)
    except ValueError as e:
        raise ConfigError(str(e)) from None


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
    ac = config.activation_checkpoint
    if ac.mode != "auto":
        return ActivationCheckpoint(ac.mode, str(ac.selective_ac_option))
    if ac.memory_budget_gib < 0 or (ac.memory_budget_gib == 0 and device_type() == "cpu"):
        raise ConfigError(
            f"activation_checkpoint.memory_budget_gib={ac.memory_budget_gib}: mode='auto' needs a budget in GiB "
            "(0 means the GPU's capacity, which a CPU run does not have); give e.g. 70"
        )
    whole_blocks_refused = compiled_block_ac_refusal(config.compile.enable, _dtensor_params_cause(config) is not None)
    return ActivationCheckpoint(
        "auto",
        str(ac.selective_ac_option),
        memory_budget_gib=ac.memory_budget_gib,
        trace_batch=_micro_batch(config),  # the step auto traces: one micro-batch of this rank's tokens
        auto_policies=("none", "op") if whole_blocks_refused else ("none", "op", "full"),
        optimizer_bytes_per_param=8,  # AdamW's exp_avg and exp_avg_sq in float32
    )


def _micro_batch(config: JobConfig) -> tuple[int, int]:
    """(sequences, tokens of each) of one forward on a rank: a local batch, or a pipeline's micro-batch, of
    the rank's share of the sequence under context parallelism."""
    p, t = config.parallelism, config.training
    sequences = p.pipeline_parallel_microbatch_size if p.pipeline_parallel_degree > 1 else t.local_batch_size
    return sequences, t.seq_len // p.context_parallel_degree


def _loss_chunk_tokens(config: JobConfig, args, plan) -> int:
    """training.loss_chunk_tokens as a number: "auto" sized from the micro-batch and the head (the vocabulary
    split over tensor-parallel ranks, as the plan's head is); the plain loss where the plan declares no head."""
    chunk = config.training.loss_chunk_tokens
    if chunk != "auto":
        return chunk
    vocab, dim = getattr(args, "vocab_size", None), getattr(args, "dim", None)
    if not plan.head_fqn or vocab is None or dim is None:
        return 0
    sequences, tokens = _micro_batch(config)
    vocab_here = -(-vocab // config.parallelism.tensor_parallel_degree)
    return auto_loss_chunk_tokens(sequences * tokens, vocab_here, dim)


def _dtensor_params_cause(config: JobConfig) -> str | None:
    """What makes the blocks' parameters DTensors (tensor parallel, SimpleFSDP), in the config's words."""
    p = config.parallelism
    if p.tensor_parallel_degree > 1:
        return f"tensor parallel (parallelism.tensor_parallel_degree={p.tensor_parallel_degree})"
    if p.fsdp_implementation == "simple_fsdp":
        return "simple_fsdp (parallelism.fsdp_implementation='simple_fsdp')"
    return None


def _check_compiled_block_ac(config: JobConfig, ac: ActivationCheckpoint) -> None:
    cause = _dtensor_params_cause(config)
    refusal = compiled_block_ac_refusal(config.compile.enable, cause is not None)
    if ac.granularity is not ACGranularity.BLOCK or refusal is None:
        return
    raise ConfigError(
        f"activation_checkpoint.mode={config.activation_checkpoint.mode!r} checkpoints whole blocks, which torch "
        f"{torch.__version__} cannot compile (compile.enable=true) with the DTensor parameters of {cause}; use "
        "activation_checkpoint.mode='selective' with selective_ac_option='op', or compile.enable=false"
        + (", or parallelism.fsdp_implementation='fsdp2'" if config.parallelism.tensor_parallel_degree == 1 else "")
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
