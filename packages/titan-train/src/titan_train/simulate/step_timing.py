"""The dry run's step time: each simulated rank's last step, traced op by op (titan_debug.op_trace), timed on a
GPU's row of the device table (titan_debug.step_time) with what the eager, plain-TP simulation leaves out of
the real run put back (compile's fusion, async TP's overlap), plus the pipeline schedule's bubbles
(pipeline_bubbles.py); the figures each rank class and the report carry, and their lines in the table.
"""

from __future__ import annotations

import dataclasses
import math

import torch.distributed as dist

from titan_debug import DeviceSpec, StepTime, predict_step_time
from titan_train.config.parallel_layout import Layout
from titan_train.simulate.pipeline_bubbles import stage_seconds, transfer_seconds


@dataclasses.dataclass(frozen=True)
class StepTimeSetting:
    """How the simulated step is timed: on which GPU, and what of the real run the (eager, plain-TP) simulation
    leaves out that the time model puts back."""

    gpu: DeviceSpec
    compiled: bool = False
    """torch.compile's fusion of memory-bound ops."""
    async_tp: bool = False
    """torch's async TP pass: TP collectives overlap the matmuls that consume them."""


def overlapped_groups(trainer, timing: StepTimeSetting) -> tuple[tuple[int, ...], ...]:
    """With async TP, the TP group's ranks (its collectives overlap their matmuls); call on the simulated rank."""
    tp = trainer.dims.submesh("tp") if timing.async_tp else None
    return (tuple(dist.get_process_group_ranks(tp.get_group())),) if tp is not None else ()


def time_rank(
    ops, timing: StepTimeSetting, overlapped, trainer, layout: Layout, rank: int, pipeline_hidden
) -> tuple[StepTime, dict]:
    """The traced step's time on `timing.gpu`, and with pipelining what pipeline_bubbles.py needs of this rank."""
    timed = predict_step_time(ops, timing.gpu, timing.compiled, overlapped_groups=overlapped)
    pipeline = {}
    if layout.pipeline:
        plan = layout.pipeline
        stages = plan.stage_ids(rank // (layout.dims.world_size // layout.dims.pp))
        shape, dtype = pipeline_hidden
        per_stage = stage_seconds(timed.by_phase, stages, plan.num_stages - 1, plan.n_microbatches)
        pipeline = {
            "pipeline_stage_seconds": {str(stage): seconds for stage, seconds in per_stage.items()},
            "pipeline_order": trainer.parallel_model.pipeline_action_order(),
            "pipeline_transfer_seconds": transfer_seconds(math.prod(shape) * dtype.itemsize, layout, timing.gpu),
        }
    return timed, pipeline


def timed_figures(timed: StepTime, pipeline: dict, tokens_per_gpu: float, flops_per_gpu: int, gpu: DeviceSpec) -> dict:
    """A rank class's step-time keys of dry_run.json."""
    return {
        "step_time": timed.as_dict(),
        "tokens_per_second_per_gpu": tokens_per_gpu / timed.seconds,
        # The paper's MFU: the model's FLOPs over the bf16 peak, float8 matmuls included.
        "mfu": flops_per_gpu / timed.seconds / gpu.bf16_flops,
        **pipeline,
    }


def step_time_summary(entries: list[dict], timing: StepTimeSetting) -> dict:
    """The run's predicted step: as slow as its slowest rank class."""
    slowest = max(entries, key=lambda e: e["step_time"]["step_seconds"])
    return {
        "gpu": dataclasses.asdict(timing.gpu),
        "compiled": timing.compiled,
        "async_tp": timing.async_tp,
        "step_seconds": slowest["step_time"]["step_seconds"],
        "tokens_per_second_per_gpu": slowest["tokens_per_second_per_gpu"],
        "mfu": slowest["mfu"],
        "slowest_rank_class": slowest["name"],
    }


def step_time_unmodelled(layout: Layout) -> list[str]:
    found = [
        "step time: a kernel's fixed cost on the GPU (launch latency, tails), small collectives' latency, "
        "overlapping streams' contention for SMs and memory, NCCL's tree algorithms"
    ]
    if layout.pipeline:
        found.append(
            "step time: pipeline micro-batches of a stage all take the same time, and a split backward's input "
            "and weight parts half of it each"
        )
    return found


def step_time_lines(report: dict) -> list[str]:
    summary = report.get("step_time")
    if not summary:
        return []
    how = "compiled" if summary["compiled"] else "eager"
    lines = [
        f"# step time on {summary['gpu']['name']} ({how}), predicted: {_seconds(summary['step_seconds'])}, "
        f"{summary['tokens_per_second_per_gpu']:,.0f} tokens/s per GPU, MFU {summary['mfu']:.1%}"
    ]
    for e in report["rank_classes"]:
        t = e["step_time"]
        lines.append(
            f"#   {e['name']}: {_seconds(t['step_seconds'])} = compute {_seconds(t['compute_seconds'])} + exposed "
            f"communication {_seconds(t['exposed_communication_seconds'])}"
            + (f" + host-bound {_seconds(t['host_bound_seconds'])}" if t.get("host_bound_seconds") else "")
            + (f" + pipeline bubble {_seconds(t['bubble_seconds'])}" if "bubble_seconds" in t else "")
            + f" (all communication {_seconds(t['communication_seconds'])})"
        )
    return lines


def _seconds(seconds: float) -> str:
    return f"{seconds:.3f} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"
