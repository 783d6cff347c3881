"""The run's parallel layout and gradient accumulation, resolved from the config and the world size
before any process group exists."""

from dataclasses import dataclass

import torch

from titan_models import get_model_spec
from titan_parallel import (
    ParallelDims,
    check_microbatches,
    check_schedule_support,
    check_tp_degree,
    resolve_num_stages,
    schedule_name,
    split_blocks,
)
from titan_train.config import ConfigError, JobConfig


@dataclass
class PipelineLayout:
    schedule: str
    stage_blocks: list[list[str]]
    """The block FQNs of each stage of the whole pipeline, in order."""
    n_microbatches: int
    """Pipeline micro-batches per local batch."""

    @property
    def num_stages(self) -> int:
        return len(self.stage_blocks)


@dataclass
class Layout:
    dims: ParallelDims
    accumulation_steps: int
    """Local batches per optimizer step on each data-parallel rank."""
    pipeline: PipelineLayout | None = None
    """None without pipeline parallelism."""

    def describe(self) -> str:
        text = f"{self.dims.describe()}, gradient accumulation {self.accumulation_steps}"
        if self.pipeline is not None:
            pp = self.pipeline
            text += f", {pp.schedule} over {pp.num_stages} stages x {pp.n_microbatches} micro-batches"
        return text


def _model_plan(config: JobConfig):
    spec = get_model_spec(config.model.name)
    return spec.plan(spec.args_for(config.model.flavor))


def resolve_layout(config: JobConfig, world_size: int) -> Layout:
    p, t = config.parallelism, config.training
    try:
        dims = ParallelDims(
            dp_replicate=p.data_parallel_replicate_degree,
            dp_shard=p.data_parallel_shard_degree,
            cp=p.context_parallel_degree,
            tp=p.tensor_parallel_degree,
            pp=p.pipeline_parallel_degree,
            world_size=world_size,
        )
    except ValueError as e:
        raise ConfigError(f"parallelism: {e}") from None
    plan = _model_plan(config)
    if dims.cp > 1 and not plan.context_parallel:
        raise ConfigError(
            f"parallelism.context_parallel_degree={dims.cp}: model.name={config.model.name!r} has no attention "
            "to run as ring attention; use 1"
        )
    if dims.cp > 1 and t.seq_len % (2 * dims.cp):
        raise ConfigError(
            f"training.seq_len={t.seq_len} is not divisible by 2 x parallelism.context_parallel_degree = "
            f"{2 * dims.cp} (each rank holds two load-balanced chunks); use a multiple of {2 * dims.cp}"
        )
    _check_simple_fsdp(config)
    if config.checkpoint.create_seed_checkpoint and world_size > 1:
        raise ConfigError(
            f"checkpoint.create_seed_checkpoint runs on one process (world size is {world_size}); "
            "run it without torchrun, then launch the parallel run from that folder"
        )
    _check_compiled_block_ac(config, dims)
    if dims.tp > 1:
        try:
            check_tp_degree(dims.tp, plan.tp_divisible)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    per_step = t.local_batch_size * dims.dp
    global_batch = per_step if t.global_batch_size == -1 else t.global_batch_size
    if global_batch % per_step:
        raise ConfigError(
            f"training.global_batch_size={global_batch} is not a multiple of training.local_batch_size="
            f"{t.local_batch_size} x data-parallel degree {dims.dp} = {per_step}; use a multiple of {per_step}"
        )
    pipeline = _pipeline_layout(config, dims, plan.block_fqns) if dims.pp > 1 else None
    return Layout(dims=dims, accumulation_steps=global_batch // per_step, pipeline=pipeline)


def _ac_granularity(config: JobConfig) -> str:
    """ "none", "op" (per-op selective) or "block" (whole blocks: full, or selective every N)."""
    ac = config.activation_checkpoint
    if ac.mode == "none":
        return "none"
    return "op" if ac.mode == "selective" and ac.selective_ac_option == "op" else "block"


def _check_compiled_block_ac(config: JobConfig, dims: ParallelDims) -> None:
    """Compiled whole-block checkpoints fail in AOTAutograd when parameters are DTensors (it saves DTensor
    mesh metadata for backward): tensor parallel and SimpleFSDP both make them so."""
    if not config.compile.enable or _ac_granularity(config) != "block":
        return
    simple = config.parallelism.fsdp_implementation == "simple_fsdp"
    if dims.tp > 1:
        cause = f"tensor parallel (parallelism.tensor_parallel_degree={dims.tp})"
    elif simple:
        cause = "simple_fsdp (parallelism.fsdp_implementation='simple_fsdp')"
    else:
        return
    raise ConfigError(
        f"activation_checkpoint.mode={config.activation_checkpoint.mode!r} checkpoints whole blocks, which torch "
        f"{torch.__version__} cannot compile (compile.enable=true) with the DTensor parameters of {cause}; use "
        "activation_checkpoint.mode='selective' with selective_ac_option='op', or compile.enable=false"
        + (", or parallelism.fsdp_implementation='fsdp2'" if dims.tp == 1 else "")
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


def _pipeline_layout(config: JobConfig, dims: ParallelDims, block_fqns: list[str]) -> PipelineLayout:
    p = config.parallelism
    explicit = [entry.split() for entry in p.pipeline_parallel_stage_blocks] or None
    if explicit and p.pipeline_parallel_layers_per_stage:
        raise ConfigError(
            "parallelism.pipeline_parallel_stage_blocks and parallelism.pipeline_parallel_layers_per_stage both "
            "set the stages; set only one"
        )
    try:
        num_stages = resolve_num_stages(
            p.pipeline_parallel_schedule,
            dims.pp,
            len(block_fqns),
            layers_per_stage=p.pipeline_parallel_layers_per_stage or None,
            num_stages=len(explicit) if explicit else None,
        )
        op_level_ac = _ac_granularity(config) == "op"
        check_schedule_support(p.pipeline_parallel_schedule, compiled=config.compile.enable, op_level_ac=op_level_ac)
        n_microbatches = check_microbatches(
            p.pipeline_parallel_schedule,
            dims.pp,
            num_stages,
            config.training.local_batch_size,
            p.pipeline_parallel_microbatch_size,
        )
        stage_blocks = split_blocks(block_fqns, num_stages, stage_blocks=explicit)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return PipelineLayout(schedule_name(p.pipeline_parallel_schedule), stage_blocks, n_microbatches)
