"""Apply the run's parallelisms to a model (or one pipeline stage of it) built on the meta device, in the
fixed order TP -> AC -> compile -> data parallel (FSDP/HSDP or DDP), from the model's plan. Weights are
materialized afterwards."""

import dataclasses

import torch
import torch.nn as nn

from titan_float8 import float8_tp_plan
from titan_parallel import (
    ParallelDims,
    apply_ac,
    apply_compile,
    apply_ddp,
    apply_fsdp,
    apply_simple_fsdp,
    apply_tp,
    enable_overlap,
)
from titan_train.config import JobConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def parallelize(model: nn.Module, plan, dims: ParallelDims, config: JobConfig) -> nn.Module:
    p, t = config.parallelism, config.training
    loss_parallel = dims.tp > 1 and p.enable_loss_parallel
    if dims.tp > 1:
        tp_plan = plan.tp_plan(loss_parallel=loss_parallel)
        if config.float8.enable:
            tp_plan = float8_tp_plan(tp_plan, model, dims.submesh("tp"))
        apply_tp(model, dims.submesh("tp"), tp_plan)
    ac = config.activation_checkpoint
    if ac.mode != "none":
        apply_ac(model, plan.block_fqns, ac.mode, ac.selective_ac_option)
    if config.compile.enable:
        apply_compile(model, plan.block_fqns, backend=config.compile.backend)
    if uses_simple_fsdp(dims, config):
        _apply_simple_fsdp(model, plan, dims, config)
    elif uses_fsdp(dims):
        apply_fsdp(
            model,
            plan.block_fqns,
            dims.fsdp_mesh(),
            param_dtype=DTYPES[t.mixed_precision_param],
            reduce_dtype=DTYPES[t.mixed_precision_reduce],
            reshard_after_forward=p.fsdp_reshard_after_forward,
            pp_enabled=dims.pp > 1,
        )
    elif dims.dp_replicate > 1:
        apply_ddp(model, dims.submesh("dp_replicate"), compiled=config.compile.enable)
    return model


def stage_plan(plan, part: nn.Module):
    """The plan of what `part` (a pipeline stage, or the whole model) holds: its blocks. (apply_tp leaves out
    the tensor-parallel entries of modules a stage does not have.)"""
    return dataclasses.replace(plan, block_fqns=[fqn for fqn in plan.block_fqns if _has(part, fqn)])


def _has(model: nn.Module, fqn: str) -> bool:
    try:
        model.get_submodule(fqn)
    except AttributeError:  # deleted by the stage split
        return False
    return True


def _apply_simple_fsdp(model: nn.Module, plan, dims: ParallelDims, config: JobConfig) -> None:
    p, t = config.parallelism, config.training
    if config.compile.enable:
        # Process-wide inductor options, set before the first (lazy) compile.
        enable_overlap(p.simple_fsdp_overlap, config.compile.backend, manual_buckets=p.simple_fsdp_manual_buckets)
    if dims.degree("dp_shard_cp") > 1:
        mesh, mode = dims.fsdp_mesh(), "hybrid_shard" if dims.dp_replicate > 1 else "fully_shard"
    else:
        mesh, mode = dims.submesh("dp_replicate"), "replicate"
    apply_simple_fsdp(
        model,
        mesh,
        mode,
        param_dtype=DTYPES[t.mixed_precision_param],
        reduce_dtype=DTYPES[t.mixed_precision_reduce],
        block_fqns=plan.block_fqns,
        # Unlike FSDP2 there is no one unsharded copy to keep between micro-batches: without recompute each
        # micro-batch in flight would hold its own, so "default" recomputes under pipelining too.
        recompute_all_gather=p.fsdp_reshard_after_forward != "never",
    )


def uses_fsdp(dims: ParallelDims) -> bool:
    """FSDP2 shards over dp_shard x cp when either is larger than 1."""
    return dims.degree("dp_shard_cp") > 1


def uses_simple_fsdp(dims: ParallelDims, config: JobConfig) -> bool:
    """SimpleFSDP does every data-parallel layout (sharded over dp_shard x cp, replicated, or both)."""
    simple = config.parallelism.fsdp_implementation == "simple_fsdp"
    return simple and (uses_fsdp(dims) or dims.dp_replicate > 1)


def casts_params(dims: ParallelDims, config: JobConfig) -> bool:
    """FSDP2 and SimpleFSDP cast parameters to the compute dtype themselves; everywhere else autocast does."""
    return uses_fsdp(dims) or uses_simple_fsdp(dims, config)
