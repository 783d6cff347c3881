"""Rank classes: the ranks of a layout that hold the same things, so one representative stands for all.

Data-parallel (replicate or shard), context-parallel and tensor-parallel ranks hold equal shares of the same
modules and run the same ops on equal shapes: without pipelining there is one class.

Pipeline ranks differ in which stages they hold (the first with the embedding, the last with the head and
the loss, a pair under a looped or V schedule) and in how many micro-batches they keep in flight. Ranks
whose stages have the same roles and the same number of blocks hold the same modules; among them, memory
differs only by the activations in flight, which every schedule here gives most to the lowest pipeline
rank (its warm-up is the longest). So such ranks form one class whose representative is the lowest: its
peak is the class's worst (tests/test_dry_run.py checks this against every pipeline rank simulated alone).
Not so with zero-bubble schedules, whose deferred weight gradients keep activations longer on later ranks
(InterleavedZeroBubble's rank 2 of 4 peaks above rank 1), nor V-shaped ones: each of their pipeline ranks is
a class, as `every_pipeline_rank=True` makes it for any schedule.
"""

from dataclasses import dataclass

from titan_parallel import SCHEDULES, ZERO_BUBBLE, Layout


@dataclass(frozen=True)
class RankClass:
    ranks: list[int]
    representative: int
    stages: tuple[int, ...]
    """The pipeline stages its ranks run (empty without pipelining)."""
    name: str


def rank_classes(layout: Layout, every_pipeline_rank: bool = False) -> list[RankClass]:
    dims, plan = layout.dims, layout.pipeline
    if plan is None:
        return [RankClass(list(range(dims.world_size)), 0, (), "all ranks")]
    # "pp" is the outermost mesh dimension: pipeline rank p owns a contiguous block of global ranks.
    per_stage_rank = dims.world_size // dims.pp
    alike_is_worst_first = (
        SCHEDULES[plan.schedule] in ("single", "loop") and plan.schedule not in ZERO_BUBBLE and not every_pipeline_rank
    )
    groups: dict[object, list[int]] = {}
    for pp_rank in range(dims.pp):
        stages = plan.stage_ids(pp_rank)
        holds = (_role(plan, stages), tuple(len(plan.stage_blocks[s]) for s in stages))
        groups.setdefault(holds if alike_is_worst_first else pp_rank, []).append(pp_rank)
    classes = []
    for pp_ranks in groups.values():
        worst = pp_ranks[0]
        stages = sorted(s for p in pp_ranks for s in plan.stage_ids(p))
        ranks = [r for p in pp_ranks for r in range(p * per_stage_rank, (p + 1) * per_stage_rank)]
        label = ",".join(str(s) for s in plan.stage_ids(worst))
        who = f"pp rank {worst}" if len(pp_ranks) == 1 else f"pp ranks {_span(pp_ranks)}, worst: pp rank {worst}"
        name = f"{who} ({_role(plan, plan.stage_ids(worst))}; stage {label})"
        classes.append(RankClass(ranks, worst * per_stage_rank, tuple(stages), name))
    return classes


def _role(plan, stages: tuple[int, ...]) -> str:
    roles = [role for role, stage in (("first", 0), ("last", plan.num_stages - 1)) if stage in stages]
    return "+".join(roles) or "middle"


def _span(pp_ranks: list[int]) -> str:
    contiguous = pp_ranks == list(range(pp_ranks[0], pp_ranks[-1] + 1))
    return f"{pp_ranks[0]}-{pp_ranks[-1]}" if contiguous else ",".join(map(str, pp_ranks))
