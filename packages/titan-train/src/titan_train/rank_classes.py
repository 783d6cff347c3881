"""Rank classes: the ranks of a layout that hold the same things, so one representative stands for all.

Data-parallel (replicate or shard), context-parallel and tensor-parallel ranks hold equal shares of the same
modules and run the same ops on equal shapes. Pipeline ranks differ: which stages they hold (first with the
embedding, last with the head and loss, a pair under a looped or V schedule) and how many micro-batches
they keep in flight. So there is one class per pipeline rank; without pipelining, one class.
"""

from dataclasses import dataclass

from titan_parallel import Layout


@dataclass(frozen=True)
class RankClass:
    ranks: list[int]
    representative: int
    stages: tuple[int, ...]
    """The pipeline stages its ranks run (empty without pipelining)."""
    name: str


def rank_classes(layout: Layout) -> list[RankClass]:
    dims, plan = layout.dims, layout.pipeline
    if plan is None:
        return [RankClass(list(range(dims.world_size)), 0, (), "all ranks")]
    # "pp" is the outermost mesh dimension: pipeline rank p owns a contiguous block of global ranks.
    per_stage_rank = dims.world_size // dims.pp
    classes = []
    for pp_rank in range(dims.pp):
        ranks = list(range(pp_rank * per_stage_rank, (pp_rank + 1) * per_stage_rank))
        stages = plan.stage_ids(pp_rank)
        roles = []
        if 0 in stages:
            roles.append("first")
        if plan.num_stages - 1 in stages:
            roles.append("last")
        role = "+".join(roles) or "middle"
        label = ",".join(str(s) for s in stages)
        classes.append(RankClass(ranks, ranks[0], tuple(stages), f"pp rank {pp_rank} ({role}; stage {label})"))
    return classes
