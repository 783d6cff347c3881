"""Apply the run's parallelisms to a model (or one pipeline stage of it) built on the meta device, in the
fixed order TP -> AC -> compile -> data parallel (FSDP/HSDP or DDP), from the model's plan. Weights are
materialized afterwards."""

import dataclasses

import torch
import torch.nn as nn

from titan_float8 import float8_tp_plan
from titan_parallel import ParallelDims, apply_ac, apply_compile, apply_ddp, apply_fsdp, apply_tp
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
    if uses_fsdp(dims):
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
    """The plan of what `part` (a pipeline stage, or the whole model) holds: its blocks, and the tensor-parallel
    entries of modules it has (a stage without the embedding has no "tok_embeddings" to shard)."""

    def tp_plan(**options):
        return {fqn: style for fqn, style in plan.tp_plan(**options).items() if "*" in fqn or _has(part, fqn)}

    blocks = [fqn for fqn in plan.block_fqns if _has(part, fqn)]
    return dataclasses.replace(plan, block_fqns=blocks, tp_plan=tp_plan)


def _has(model: nn.Module, fqn: str) -> bool:
    try:
        model.get_submodule(fqn)
    except AttributeError:  # absent, or set to None by the stage split
        return False
    return True


def uses_fsdp(dims: ParallelDims) -> bool:
    """FSDP casts parameters to the compute dtype itself; everywhere else autocast does."""
    return dims.degree("dp_shard_cp") > 1
