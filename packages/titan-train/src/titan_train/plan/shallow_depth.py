"""A deep model's layout dry-run at two shallow depths, its figures extrapolated per block to the full depth.

A dry run costs about 0.75 s per block of a 70B model at 256 ranks here (fake tensors through FSDP, TP and
checkpointing, two steps), 73 s for its 80 blocks: too slow for a planner that compares hundreds of layouts.
What a rank holds and does comes per block (its share of a block's parameters, gradients and optimizer state,
a block's saved activations, its matmuls, FSDP's gathers and reductions, TP's collectives) or once (the
embedding, the head and the loss, the optimizer's fixed work), so each figure is affine in the blocks a rank
holds. The same layout is simulated with SHALLOW_BLOCKS blocks per rank (the mesh, the batch, the levers and
the pipeline's stages unchanged; a rank of a looped or V schedule shares them between its two stages, keeping
their difference at full depth: _stage_splits), and each rank class's figures are extended along
the line through the two to the blocks it holds at full depth; pipeline stages' forward and backward seconds
by their own blocks, and the schedule is then replayed at full depth (simulate/pipeline_bubbles.py) as for a
full dry run.

The active peak is the largest of the phases' extended peaks (`peak_active_gib_by_phase`): a step's peak is
the largest of its phases', so not affine itself; shallow, the loss's logits may outweigh the blocks'
activations and put the peak where it is not at full depth. The reserved peak adds the larger of the two
shallow runs' allocator slack (reserved minus active: fragmentation), which is not affine in depth either: it
may shrink between the shallow runs and grow again (70B: 6.1, 5.6, 5.4 GiB at 2, 4, 8 blocks, 6.3 at 80) or
grow slowly (8B: 9.7, 10.0, 10.3 at 2, 4, 8, 12.7 at 32); extending its line instead overshot a 405B pipeline
by 7.8%. Against full dry runs: docs/planner.md (the reserved peak is the least exact figure, so the
planner dry-runs its first choice again at full depth).

Simulated at full depth instead: models whose blocks differ (MoE layers with dense ones between them), a
recipe's own pipeline split, and activation_checkpoint.mode = "auto", whose choice is made against the whole
model's memory budget.
"""

from __future__ import annotations

import dataclasses
import time

from titan_models import get_model_spec
from titan_train.config import JobConfig
from titan_train.config.parallel_layout import tokens_per_step
from titan_train.simulate.dry_run import DryRunJob, flops_per_gpu, prepare_dry_run

SHALLOW_BLOCKS = (2, 4)
"""Blocks per rank (the whole model without pipelining) of the two shallow dry runs: two, not one, so that
FSDP's prefetch of the next block and the first block's exposed gather are as at full depth."""


def reducible(job: DryRunJob) -> bool:
    """Whether `job` can be simulated shallow (see above; its checkpoint mode aside) and gains by it."""
    args, p = job.model_args, job.config.parallelism
    moe = getattr(args, "moe", None)
    uniform = moe is None or (moe.sparse_step == 1 and not moe.dense_layers)
    own_split = p.pipeline_parallel_layers_per_stage or p.pipeline_parallel_stage_blocks
    return uniform and not own_split and sum(_depths(job.layout)) < args.n_layers


def shallow_configs(job: DryRunJob) -> list[JobConfig] | None:
    """The configs of `job`'s two shallow dry runs, or None where it runs at full depth."""
    if job.config.activation_checkpoint.mode == "auto" or not reducible(job):
        return None
    return [_shallow(job, split) for split in _stage_splits(job.layout)]


def _depths(layout) -> list[int]:
    return [sum(split) for split in _stage_splits(layout)]


def _stage_splits(layout) -> list[list[int]]:
    """Blocks per stage of the two shallow runs: SHALLOW_BLOCKS per rank, shared by its stages (at least one and
    two per stage). A rank whose stages differ (the automatic split gives the end stages fewer) keeps their
    differences, each of its stages as many blocks fewer as its smallest, so that every stage of the rank gains
    a block from one run to the next and the rank's figures lie on one line; through an even split instead, a
    looped schedule's last rank (a middle stage with a block more, the last with a block less) came out 4-6%
    under its active peak at full depth. A rank of one stage is extended by its own blocks already."""
    if layout.pipeline is None:
        return [[blocks] for blocks in SHALLOW_BLOCKS]
    plan = layout.pipeline
    full = [len(blocks) for blocks in plan.stage_blocks]
    per_rank = plan.num_stages // plan.degree
    splits = []
    for least, blocks in zip((1, 2), SHALLOW_BLOCKS, strict=True):
        split = list(full)
        for rank in range(plan.degree):
            own = plan.stage_ids(rank)
            for stage in own:
                split[stage] += max(least, blocks // per_rank) - min(full[s] for s in own)
        splits.append(split)
    return splits


def _shallow(job: DryRunJob, split: list[int]) -> JobConfig:
    depth = sum(split)
    config = dataclasses.replace(job.config, model=dataclasses.replace(job.config.model, n_layers=depth))
    if job.layout.pipeline is None:
        return config
    # The split explicit (the automatic one at this depth has another shape). The shallow model's arguments are
    # the job's at that depth, as model_args() would make them from the shallow config.
    shallow_args = dataclasses.replace(job.model_args, n_layers=depth)
    blocks = get_model_spec(config.model.name).plan(shallow_args).block_fqns
    ends = [sum(split[:stage]) for stage in range(len(split) + 1)]
    stage_blocks = [" ".join(blocks[start:end]) for start, end in zip(ends, ends[1:], strict=False)]
    return dataclasses.replace(
        config, parallelism=dataclasses.replace(config.parallelism, pipeline_parallel_stage_blocks=stage_blocks)
    )


def extrapolated_entries(job: DryRunJob, shallow: list[tuple[DryRunJob, list[dict]]]) -> list[dict]:
    """The entries of `job`'s rank classes (as simulate_class returns them) from its two shallow runs' (each
    job with its classes' entries). A class is extended from the shallow class holding its representative
    rank (the same pipeline role; under a schedule whose alike ranks form one class, that class's worst)."""
    (near, near_entries), (far, far_entries) = shallow
    entries = []
    for rank_class in job.classes:
        rank = rank_class.representative
        a, b = _entry_of(near, near_entries, rank), _entry_of(far, far_entries, rank)
        x = [_blocks_of(j, rank) for j in (near, far, job)]
        entry = _extended(a, b, *x)
        entry.update(ranks=rank_class.ranks, name=rank_class.name, stages=list(rank_class.stages))
        _peak_from_phases(entry, b)
        slack = max(e["peak_reserved_gib"] - e["peak_active_gib"] for e in (a, b))
        entry["peak_reserved_gib"] = entry["peak_active_gib"] + slack
        entry["segments"] = b["segments"]  # a count, not extended
        entry["out_of_memory"] = None  # the capacity check is the reserved peak's (finish_report's warnings)
        seconds = entry["step_time"]["step_seconds"]
        entry["flops_per_step"] = flops = flops_per_gpu(job.config, job.model_args, job.layout)
        entry["tokens_per_second_per_gpu"] = tokens_per_step(job.config, job.layout) / job.world_size / seconds
        entry["mfu"] = flops / seconds / job.timing.gpu.bf16_flops
        if job.layout.pipeline:
            entry["pipeline_stage_seconds"] = _stage_seconds(job, near, far, a, b, rank)
        entries.append(entry)
    return entries


def _peak_from_phases(entry: dict, b: dict) -> None:
    """The active peak as the largest of the phases' extended peaks (in place): a step's peak is the largest of
    its phases', each affine in the blocks, so their maximum is not: the line through two shallow peaks in the
    loss (the logits outweigh two blocks' activations) would miss a full depth's in backward."""
    phases = entry["peak_active_gib_by_phase"]
    phase = max(phases, key=phases.get)
    op = b["peak_op"] if b["peak_phase"] == phase else "(extrapolated)"
    entry.update(peak_active_gib=phases[phase], peak_phase=phase, peak_op=op)


def _entry_of(job: DryRunJob, entries: list[dict], rank: int) -> dict:
    return next(e for e in entries if rank in e["ranks"])


def _blocks_of(job: DryRunJob, rank: int) -> int:
    """Blocks the rank holds: its stages' under pipelining, else the model's."""
    plan = job.layout.pipeline
    if plan is None:
        return job.model_args.n_layers
    return sum(len(plan.stage_blocks[s]) for s in plan.stage_ids(_pp_rank(job, rank)))


def _pp_rank(job: DryRunJob, rank: int) -> int:
    return rank // (job.world_size // job.layout.dims.pp)


def _stage_seconds(job: DryRunJob, near: DryRunJob, far: DryRunJob, a: dict, b: dict, rank: int) -> dict:
    """The full-depth representative's stages' seconds per micro-batch, each extended by its own blocks from
    the shallow entry's stage at the same position on its rank."""
    full = job.layout.pipeline
    own = full.stage_ids(_pp_rank(job, rank))
    out = {}
    for position, stage in enumerate(own):
        shallow_stage = [
            j.layout.pipeline.stage_ids(_pp_rank(j, e["ranks"][0]))[position] for j, e in ((near, a), (far, b))
        ]
        blocks = [len(j.layout.pipeline.stage_blocks[s]) for j, s in zip((near, far), shallow_stage, strict=True)]
        out[str(stage)] = _extended(
            a["pipeline_stage_seconds"][str(shallow_stage[0])],
            b["pipeline_stage_seconds"][str(shallow_stage[1])],
            *blocks,
            len(full.stage_blocks[stage]),
        )
    return out


def _extended(a, b, x_a: int, x_b: int, x: int):
    """`b`'s structure with every number on the line through (x_a, a) and (x_b, b) at x; what is not a number
    in both is `b`'s."""
    if isinstance(b, dict) and isinstance(a, dict):
        return {key: _extended(a[key], value, x_a, x_b, x) if key in a else value for key, value in b.items()}
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    if not numbers:
        return b
    return b + (b - a) * (x - x_b) / (x_b - x_a)


@dataclasses.dataclass
class ShallowRun:
    entries: list[dict]
    """`job`'s rank classes' entries, extrapolated to its full depth."""
    depths: list[int]
    """The two depths simulated."""
    full_depth_seconds: float
    """About how long a dry run of `job` at full depth takes here: the two runs' seconds extended likewise."""


def simulate_shallow(job: DryRunJob, simulate) -> ShallowRun | None:
    """`job` dry-run at two shallow depths (`simulate(job, rank_class)` runs one class) and extrapolated; None
    where it must run at full depth."""
    configs = shallow_configs(job)
    if configs is None:
        return None
    runs, seconds = [], []
    for config in configs:
        began = time.perf_counter()
        shallow = prepare_dry_run(config, job.world_size, job.device_memory_gib, gpu=job.timing.gpu)
        runs.append((shallow, [simulate(shallow, rank_class) for rank_class in shallow.classes]))
        seconds.append(time.perf_counter() - began)
    depths = [config.model.n_layers for config in configs]
    full = job.model_args.n_layers
    return ShallowRun(extrapolated_entries(job, runs), depths, max(0.0, _extended(*seconds, *depths, full)))
