"""Pipeline bubbles in the dry run's step time: each rank class's traced step has no waiting between stages
(the simulated receives return at once), so the schedule is replayed from its own action order
(titan_debug/pipeline_time.py) with every stage's traced forward and backward time per micro-batch, and
each class's step grows by its representative rank's bubble.

A class of several pipeline ranks was traced on one of them: its other ranks' stages take the time of the
representative's stage at the same position (the same role and number of blocks: rank_classes.py).
"""

from __future__ import annotations

from titan_debug import DeviceSpec, link_bandwidth, simulate_schedule
from titan_train.config.parallel_layout import Layout


def stage_seconds(by_phase: dict[str, float], stages: list[int], last_stage: int, n_microbatches: int) -> dict:
    """One micro-batch's forward and backward seconds of each of `stages`, from the traced busy seconds per
    phase ("stageN.forward", "stageN.loss", "stageN.backward"; the loss's backward, "loss_backward", belongs
    to the last stage)."""
    seconds = {}
    for stage in stages:
        forward = by_phase.get(f"stage{stage}.forward", 0.0) + by_phase.get(f"stage{stage}.loss", 0.0)
        backward = by_phase.get(f"stage{stage}.backward", 0.0)
        if stage == last_stage:
            backward += by_phase.get("loss_backward", 0.0)
        seconds[stage] = {"forward": forward / n_microbatches, "backward": backward / n_microbatches}
    return seconds


def transfer_seconds(hidden_bytes: int, layout: Layout, device: DeviceSpec) -> float:
    """Seconds to send one micro-batch's activations to the next pipeline rank (global ranks world/pp apart)."""
    step = layout.dims.world_size // layout.dims.pp
    return hidden_bytes / link_bandwidth((0, step), device)


def add_pipeline_bubbles(entries: list[dict], layout: Layout, order: dict[int, list], transfer: float) -> None:
    """Set each entry's step_time "bubble_seconds" and grow its step, tokens/s and MFU by it (in place).
    `order`: per pipeline rank its actions (Pipeline.action_order)."""
    plan, per_pp_rank = layout.pipeline, layout.dims.world_size // layout.dims.pp
    forward, backward = {}, {}
    for entry in entries:
        representative = entry["ranks"][0] // per_pp_rank
        own = plan.stage_ids(representative)
        for pp_rank in sorted({r // per_pp_rank for r in entry["ranks"]}):
            for position, stage in enumerate(plan.stage_ids(pp_rank)):
                timed = entry["pipeline_stage_seconds"][str(own[position])]
                forward[stage], backward[stage] = timed["forward"], timed["backward"]
    timeline = simulate_schedule(order, forward, backward, transfer)
    for entry in entries:
        bubble = timeline.bubble(entry["ranks"][0] // per_pp_rank)
        timed = entry["step_time"]
        before = timed["step_seconds"]
        timed["bubble_seconds"] = bubble
        timed["step_seconds"] = before + bubble
        entry["tokens_per_second_per_gpu"] *= before / timed["step_seconds"]
        entry["mfu"] *= before / timed["step_seconds"]
