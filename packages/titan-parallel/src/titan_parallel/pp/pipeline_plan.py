"""Pipeline parallelism, the plan: how many stages, which blocks each holds, how many micro-batches, which
stages a rank runs. Every check is here and needs no process group, so a trainer runs it with its config
validation (`plan_pipeline`), long before building anything. Errors name these functions' parameters
(`schedule=`, `pp_degree=`, ...), or what a caller calls them (options/option_names.py).
"""

import math
from dataclasses import dataclass

from torch.distributed.pipelining.schedules import get_schedule_class

from titan_parallel.options.option_names import named
from titan_parallel.pp.pipeline_split import split_blocks

# Name -> stage placement: "single" (one stage per rank), "loop" (stages r, r + pp, ... on rank r) or "v"
# (two stages per rank, r and 2 pp - 1 - r, so the first and last stage share rank 0).
SCHEDULES = {
    "GPipe": "single",
    "1F1B": "single",
    "Interleaved1F1B": "loop",
    "InterleavedZeroBubble": "loop",
    "ZBVZeroBubble": "v",
    "DualPipeV": "v",
}
# These split each backward into an input part and a weight part (run later to fill bubbles); compiled blocks
# fail there (stage_backward_input raises), so build_pipeline refuses them.
ZERO_BUBBLE = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")


def schedule_name(name: str) -> str:
    """The canonical spelling of a schedule name (matched case-insensitively, as torch does)."""
    for known in SCHEDULES:
        if known.lower() == name.lower():
            return known
    raise ValueError(f"{named('schedule')}={name!r} is unknown; use one of {', '.join(SCHEDULES)}")


def schedule_class(name: str) -> type:
    """torch's schedule class for a name in SCHEDULES."""
    return get_schedule_class(schedule_name(name))


def resolve_num_stages(
    schedule: str,
    pp_degree: int,
    n_blocks: int,
    *,
    layers_per_stage: int | None = None,
    num_stages: int | None = None,
    input_weight: float = 1,
    output_weight: float = 1,
) -> int:
    """Stages in the whole pipeline, checked against the schedule and the model.

    By default one stage per rank for single-stage schedules and two for the others. `layers_per_stage`
    derives it from the model instead (embedding and output counted as `input_weight`/`output_weight`
    blocks, as in `split_blocks`); `num_stages` gives it explicitly (e.g. the length of an explicit split).
    """
    name = schedule_name(schedule)
    style = SCHEDULES[name]
    if layers_per_stage is not None:
        if layers_per_stage < 1:
            raise ValueError(f"{named('layers_per_stage')}={layers_per_stage} must be >= 1")
        num_stages = math.ceil((n_blocks + input_weight + output_weight) / layers_per_stage)
        source = (
            f"{named('layers_per_stage')}={layers_per_stage} makes {num_stages} stages "
            f"(({n_blocks} blocks + {input_weight} + {output_weight}) / {layers_per_stage}, rounded up)"
        )
    elif num_stages is not None:
        source = f"the explicit split has {num_stages} stages"
    else:
        num_stages = pp_degree * (1 if style == "single" else 2)
        source = f"{num_stages} stages"
    per_rank, rest = divmod(num_stages, pp_degree)
    if rest or per_rank < 1:
        raise ValueError(f"{source}: not a multiple of {named('pp_degree')}={pp_degree}")
    wanted = {"single": 1, "v": 2}.get(style)
    if wanted is not None and per_rank != wanted:
        raise ValueError(
            f"{source}, {per_rank} per rank, but {named('schedule')}={name!r} runs exactly "
            f"{wanted} per rank ({wanted * pp_degree} stages); "
            + ("use Interleaved1F1B for more" if wanted == 1 else "use Interleaved1F1B for other counts")
        )
    if n_blocks < num_stages:
        raise ValueError(
            f"{source} but the model has {n_blocks} blocks; each stage needs at least one: lower "
            f"{named('pp_degree')}={pp_degree} or the stages per rank"
        )
    return num_stages


def check_schedule_support(schedule: str, *, compiled: bool = False, op_level_ac: bool = False) -> None:
    """Zero-bubble schedules split each backward into an input part and a weight part: compiled blocks do
    not support that, and per-op (selective) activation checkpointing allows one backward per region.
    A ValueError naming the settings to change."""
    name = schedule_name(schedule)
    if name not in ZERO_BUBBLE:
        return
    split = f"{named('schedule')}={name!r} splits backward into input and weight parts"
    if compiled:
        raise ValueError(
            f"{split}, which compiled blocks do not support; turn off {named('compiled')} or use 1F1B / Interleaved1F1B"
        )
    if op_level_ac:
        raise ValueError(
            f"{split}, two backward passes, but per-op selective activation checkpointing ({named('op_level_ac')}) "
            "allows one; checkpoint whole blocks instead, or use 1F1B / Interleaved1F1B"
        )


def stage_ids_for_rank(schedule: str, pp_rank: int, pp_degree: int, num_stages: int) -> tuple[int, ...]:
    """The stages pipeline rank `pp_rank` runs: looped (r, r + pp, ...) or V-shaped (r, 2 pp - 1 - r)."""
    if SCHEDULES[schedule_name(schedule)] == "v":
        return (pp_rank, num_stages - 1 - pp_rank)
    return tuple(range(pp_rank, num_stages, pp_degree))


def check_microbatches(
    schedule: str, pp_degree: int, num_stages: int, local_batch_size: int, microbatch_size: int
) -> int:
    """The number of microbatches per step, or a ValueError saying which setting to change and to what."""
    lbs, mbs = local_batch_size, microbatch_size
    if mbs < 1 or lbs % mbs:
        sizes = [d for d in range(1, lbs + 1) if lbs % d == 0]
        raise ValueError(
            f"{named('local_batch_size')}={lbs} is not divisible by {named('microbatch_size')}={mbs}; use a "
            f"microbatch size in {sizes}"
        )
    n = lbs // mbs
    name = schedule_name(schedule)
    split = f"{named('local_batch_size')}={lbs} / {named('microbatch_size')}={mbs} = {n}"
    need = {"1F1B": pp_degree, "DualPipeV": num_stages}.get(name, 1)
    if n < need:
        raise ValueError(
            f"{named('schedule')}={name!r} needs at least {need} microbatches (one per "
            f"{'rank' if name == '1F1B' else 'stage'}) but {split}; use a local batch of at least "
            f"{need * mbs} or a microbatch size of at most {lbs // need}"
        )
    rounds = max(1, n // pp_degree)
    if name in ("Interleaved1F1B", "InterleavedZeroBubble") and n % rounds:
        raise ValueError(
            f"{named('schedule')}={name!r} runs microbatches in rounds of about "
            f"{named('pp_degree')}={pp_degree} ({rounds} rounds), which must divide them, but "
            f"{split}; use a multiple of {pp_degree} microbatches"
        )
    return n


@dataclass(frozen=True)
class PipelinePlan:
    """A checked pipeline: what `build_pipeline` builds on every pipeline rank."""

    schedule: str
    """Canonical schedule name (a key of SCHEDULES)."""
    degree: int
    """Pipeline-parallel ranks."""
    stage_blocks: list[list[str]]
    """The block FQNs of each stage of the whole pipeline, in order."""
    n_microbatches: int
    """Pipeline micro-batches per local batch."""

    @property
    def num_stages(self) -> int:
        return len(self.stage_blocks)

    def stage_ids(self, pp_rank: int) -> tuple[int, ...]:
        """The stages pipeline rank `pp_rank` runs."""
        return stage_ids_for_rank(self.schedule, pp_rank, self.degree, self.num_stages)

    def describe(self) -> str:
        return f"{self.schedule} over {self.num_stages} stages x {self.n_microbatches} micro-batches"


def plan_pipeline(
    schedule: str,
    pp_degree: int,
    block_fqns: list[str],
    local_batch_size: int,
    microbatch_size: int = 1,
    *,
    layers_per_stage: int | None = None,
    stage_blocks: list[list[str]] | None = None,
    compiled: bool = False,
    op_level_ac: bool = False,
) -> PipelinePlan:
    """Check a pipeline against the model's blocks, the batch and the other transforms, and split it.

    `layers_per_stage` derives the stage count from the model (embedding and output count as a block each);
    `stage_blocks` gives the split explicitly; neither: one stage per rank (two for multi-stage schedules).
    `compiled` / `op_level_ac`: whether blocks are compiled / checkpointed per op (zero-bubble schedules
    support neither). A ValueError names the parameter to change and what would work.
    """
    if stage_blocks is not None and layers_per_stage is not None:
        raise ValueError(f"{named('stage_blocks')} and {named('layers_per_stage')} both set the stages; set only one")
    num_stages = resolve_num_stages(
        schedule,
        pp_degree,
        len(block_fqns),
        layers_per_stage=layers_per_stage,
        num_stages=len(stage_blocks) if stage_blocks is not None else None,
    )
    check_schedule_support(schedule, compiled=compiled, op_level_ac=op_level_ac)
    n_microbatches = check_microbatches(schedule, pp_degree, num_stages, local_batch_size, microbatch_size)
    blocks = split_blocks(block_fqns, num_stages, stage_blocks=stage_blocks)
    return PipelinePlan(schedule_name(schedule), pp_degree, blocks, n_microbatches)
