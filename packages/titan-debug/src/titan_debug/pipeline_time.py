"""A pipeline schedule's time from its own action order: every pipeline rank runs its actions in the order
the schedule gives them, each starting when its rank is free and what it needs has arrived.

An action is (stage, kind, micro-batch), kind one of F (forward), B (full backward), I (backward for the
input) and W (backward for the weights), as torch's schedules name them (`pipeline_order`). Needs:
- F of stage s, micro-batch m: F(s-1, m), plus the activations' transfer when s-1 runs on another rank;
- B or I of stage s: B or I of stage s+1 (plus the gradient's transfer), the last stage its own F(s, m);
- W of stage s: I(s, m).
Durations per stage come from the stage's traced forward and backward (step_time.py's phases), divided by
the micro-batches; a split backward's I and W take half of B each (torch's zero-bubble schedules split the
same work, the weight half being the deferred matmuls).

The bubble of a rank is its makespan less its own actions' time.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PipelineTime:
    seconds: float
    """When the last action of any rank finishes."""
    finish: dict[int, float]
    """Per pipeline rank, when its last action finishes."""
    busy: dict[int, float]
    """Per pipeline rank, the time of its own actions."""

    def bubble(self, rank: int) -> float:
        return self.finish[rank] - self.busy[rank]


def action_seconds(kind: str, forward: float, backward: float) -> float:
    return {"F": forward, "B": backward, "I": backward / 2, "W": backward / 2}[kind]


def simulate_schedule(
    order: dict[int, list[tuple[int, str, int]]],
    forward: dict[int, float],
    backward: dict[int, float],
    transfer: float,
) -> PipelineTime:
    """`order`: per pipeline rank its actions in order; `forward` / `backward`: per stage, one micro-batch's
    seconds; `transfer`: seconds to send one micro-batch's activations (or their gradient) to another rank."""
    stage_rank = {stage: rank for rank, actions in order.items() for stage, _, _ in actions}
    last_stage = max(stage_rank)
    done: dict[tuple[int, str, int], float] = {}
    position = dict.fromkeys(order, 0)
    free = dict.fromkeys(order, 0.0)
    busy = dict.fromkeys(order, 0.0)

    def needs(stage: int, kind: str, microbatch: int) -> list[tuple[tuple[int, str, int], bool]]:
        """(the action needed, whether its result crosses ranks)."""
        if kind == "F":
            return [((stage - 1, "F", microbatch), True)] if stage > 0 else []
        if kind == "W":
            return [((stage, "I", microbatch), False)]
        if stage == last_stage:
            return [((stage, "F", microbatch), False)]
        return [((stage + 1, "B", microbatch), True), ((stage + 1, "I", microbatch), True)]

    def ready_at(stage: int, kind: str, microbatch: int) -> float | None:
        """When the action's inputs are there; None while they are not. A backward of a stage before the last
        needs the next stage's B or I, whichever that stage runs."""
        found = [(action, crosses) for action, crosses in needs(stage, kind, microbatch) if action in done]
        if not found:
            return None if needs(stage, kind, microbatch) else 0.0
        needed, crosses = found[0]
        return done[needed] + (transfer if crosses and stage_rank[needed[0]] != stage_rank[stage] else 0.0)

    remaining = sum(len(a) for a in order.values())
    while remaining:
        progressed = False
        for rank, actions in order.items():
            while position[rank] < len(actions):
                stage, kind, microbatch = actions[position[rank]]
                ready = ready_at(stage, kind, microbatch)
                if ready is None:
                    break
                duration = action_seconds(kind, forward[stage], backward[stage])
                end = max(free[rank], ready) + duration
                done[(stage, kind, microbatch)] = free[rank] = end
                busy[rank] += duration
                position[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {rank: actions[position[rank]] for rank, actions in order.items() if position[rank] < len(actions)}
            raise ValueError(f"the schedule cannot progress: each rank waits on an action never run: {stuck}")
    return PipelineTime(max(free.values(), default=0.0), free, busy)
