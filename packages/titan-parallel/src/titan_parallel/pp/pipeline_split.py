"""Splitting a model into pipeline stages: which blocks each stage owns, and the stage modules themselves.

A stage is a copy of the whole (meta-device) model with what it does not own removed, as in TorchTitan's
`pipeline_module_split`: blocks are deleted from their `nn.ModuleDict` (the ones left keep their global
names, so state_dict keys and checkpoints are the same as without pipelining), and input/output modules
are set to None, which the model's forward must tolerate (no embedding: the input is already hidden
states; no output: return hidden states).
"""

import copy
from collections.abc import Callable

import torch.nn as nn

from titan_parallel.options.option_names import named


def split_blocks(
    block_fqns: list[str],
    num_stages: int,
    *,
    stage_blocks: list[list[str]] | None = None,
    input_weight: float = 1,
    output_weight: float = 1,
) -> list[list[str]]:
    """The block FQNs each stage owns, in order; every stage gets at least one block.

    Without `stage_blocks`, blocks are dealt so that the most loaded stage is as light as possible, counting
    the input modules (embedding) as `input_weight` blocks on the first stage and the output modules (norm,
    output projection) as `output_weight` blocks on the last, so those stages get fewer blocks (0 and 0: an
    even split). Left-over blocks go to the earlier stages. `stage_blocks` is an explicit split, checked.
    """
    n = len(block_fqns)
    if num_stages < 1:
        raise ValueError(f"the number of pipeline stages must be >= 1, got {num_stages}")
    if n < num_stages:
        raise ValueError(
            f"the model has {n} blocks but the pipeline has {num_stages} stages ({named('pp_degree')} x stages per "
            f"rank); each stage needs at least one block: use at most {n} stages"
        )
    if stage_blocks is not None:
        _check_explicit(block_fqns, num_stages, stage_blocks)
        return [list(stage) for stage in stage_blocks]
    if input_weight < 0 or output_weight < 0:
        raise ValueError(f"input_weight={input_weight} and output_weight={output_weight} must be >= 0")
    counts = [1] * num_stages
    extra = [0.0] * num_stages
    extra[0] += input_weight
    extra[-1] += output_weight
    for _ in range(n - num_stages):
        # Water-filling: each block goes to the currently lightest stage (min() keeps the earliest on ties).
        lightest = min(range(num_stages), key=lambda s: counts[s] + extra[s])
        counts[lightest] += 1
    stages, start = [], 0
    for count in counts:
        stages.append(block_fqns[start : start + count])
        start += count
    return stages


def _check_explicit(block_fqns: list[str], num_stages: int, stage_blocks: list[list[str]]) -> None:
    field = named("stage_blocks")
    if len(stage_blocks) != num_stages:
        raise ValueError(f"{field} lists {len(stage_blocks)} stages but the pipeline has {num_stages}")
    empty = [i for i, stage in enumerate(stage_blocks) if not stage]
    if empty:
        raise ValueError(f"{field}: stages {empty} have no blocks; each stage needs at least one")
    flat = [fqn for stage in stage_blocks for fqn in stage]
    if flat != list(block_fqns):
        unknown = sorted(set(flat) - set(block_fqns))
        missing = [fqn for fqn in block_fqns if fqn not in flat]
        twice = sorted({fqn for fqn in flat if flat.count(fqn) > 1})
        if unknown:
            problem = f"unknown blocks {unknown}"
        elif missing:
            problem = f"missing blocks {missing}"
        elif twice:
            problem = f"blocks listed twice {twice}"
        else:
            problem = "blocks out of order"
        raise ValueError(f"{field} must list every block once, in model order ({block_fqns}); found {problem}")


def build_stage_modules(
    model: nn.Module | Callable[[], nn.Module],
    stage_blocks: list[list[str]],
    stage_ids: list[int] | tuple[int, ...],
    input_fqns: list[str],
    output_fqns: list[str],
    shared_input_fqns: list[str] = (),
) -> list[nn.Module]:
    """The modules of the stages `stage_ids` (this rank's), one per id, in that order.

    `model` is the whole model, normally on the meta device (deep-copied per stage), or a zero-argument
    factory called once per stage. Stage i keeps the blocks `stage_blocks[i]`; the first stage also keeps
    `input_fqns`, the last `output_fqns` and a copy of `shared_input_fqns` (input modules it uses too: their
    gradients are summed with the first stage's, shared_inputs.py). Blocks must live in an `nn.ModuleDict`.
    """
    unknown = sorted(set(shared_input_fqns) - set(input_fqns))
    if unknown:
        raise ValueError(f"shared_input_fqns {unknown} are not input modules ({input_fqns}); share input modules only")
    num_stages = len(stage_blocks)
    for stage_id in stage_ids:
        if not 0 <= stage_id < num_stages:
            raise ValueError(f"stage id {stage_id} is outside the {num_stages} stages")
    every_block = [fqn for stage in stage_blocks for fqn in stage]
    parts = []
    for stage_id in stage_ids:
        part = model() if callable(model) and not isinstance(model, nn.Module) else copy.deepcopy(model)
        keep = set(stage_blocks[stage_id])
        for fqn in every_block:
            if fqn not in keep:
                _delete_block(part, fqn)
        last = stage_id == num_stages - 1
        inputs = [] if stage_id == 0 else [fqn for fqn in input_fqns if not (last and fqn in shared_input_fqns)]
        drop = inputs + ([] if last else output_fqns)
        for fqn in drop:
            parent, _, name = fqn.rpartition(".")
            setattr(part.get_submodule(parent), name, None)
        parts.append(part)
    return parts


def _delete_block(model: nn.Module, fqn: str) -> None:
    parent_fqn, _, name = fqn.rpartition(".")
    parent = model.get_submodule(parent_fqn)
    if not isinstance(parent, nn.ModuleDict):
        raise TypeError(
            f"block {fqn!r} lives in a {type(parent).__name__}; pipeline stages need blocks in an nn.ModuleDict "
            "so the blocks a stage keeps keep their names (and checkpoint keys)"
        )
    del parent[name]
