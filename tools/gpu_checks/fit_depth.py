"""How many blocks of a model's width one device holds, by Titan's own dry run: the deepest model whose predicted
reserved peak leaves MARGIN of the device's memory free.

A dry run at full depth costs about a second per block of Llama 3.1 8B's width at 8,192 tokens here, so the
config is dry-run at the planner's two shallow depths (titan_train.plan.shallow_depth.SHALLOW_BLOCKS) and its
figures extended per block along the line through them, by the planner's rule for the active peak (the largest
of the phases' extended peaks: shallow, the loss's logits may hold the peak that backward holds deeper). The
reserved peak adds the allocator's slack (reserved minus active), which grows with depth but not on a line: at
8B width, batch 2 x 8192, selective AC it is 3.4, 4.5 and 8.0 GiB at 2, 4 and 16 blocks. The planner adds the
larger shallow slack (4.5 GiB: 3.9% under the full dry run at 16 blocks); here the slack's own line is also
taken when it is larger (11.0 GiB: 3.4% over), since a choice that overshoots costs a block and one that
undershoots may not fit. The choice is then dry-run at full depth (table1 starts that beside its first
training run) for the record.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from gpu_checks.context import CheckFailed, Context
from gpu_checks.memory import device_memory_gib
from gpu_checks.training import RECIPE
from titan_train.plan.shallow_depth import SHALLOW_BLOCKS

MARGIN = 0.10  # of the device's memory left free by the chosen depth's predicted reserved peak


@dataclass(frozen=True)
class Line:
    """A rank's figures at two shallow depths (the dry run's rank-class entries), extended per block."""

    near: dict
    far: dict
    depths: tuple[int, int] = SHALLOW_BLOCKS

    def _at(self, near: float, far: float, depth: int) -> float:
        (x_near, x_far) = self.depths
        return far + (far - near) * (depth - x_far) / (x_far - x_near)

    def peak_active_gib(self, depth: int) -> float:
        phases_near, phases_far = self.near["peak_active_gib_by_phase"], self.far["peak_active_gib_by_phase"]
        return max(self._at(phases_near[p], value, depth) for p, value in phases_far.items() if p in phases_near)

    def peak_reserved_gib(self, depth: int) -> float:
        slack_near, slack_far = (e["peak_reserved_gib"] - e["peak_active_gib"] for e in (self.near, self.far))
        slack = max(slack_near, slack_far, self._at(slack_near, slack_far, depth))
        return self.peak_active_gib(depth) + slack


def deepest_fitting(peak_gib: Callable[[int], float], capacity_gib: float, max_depth: int) -> int:
    """The largest depth up to `max_depth` whose peak is at most `capacity_gib`; a CheckFailed if not even one
    block fits."""
    fitting = [depth for depth in range(1, max_depth + 1) if peak_gib(depth) <= capacity_gib]
    if not fitting:
        raise CheckFailed(f"not one block fits: {peak_gib(1):.1f} GiB predicted at depth 1 > {capacity_gib:.1f} GiB")
    return max(fitting)


@dataclass(frozen=True)
class DepthChoice:
    n_layers: int
    device_memory_gib: float
    capacity_gib: float  # the device's memory less MARGIN
    lines: dict[str, Line]  # per variant dry-run (bf16, float8)

    def figures(self) -> dict:
        """What the choice rests on, for the record: each variant's extended peaks at the depth and one more."""
        predicted = {
            variant: {
                "peak_reserved_gib": line.peak_reserved_gib(self.n_layers),
                "peak_active_gib": line.peak_active_gib(self.n_layers),
                "one_more_peak_reserved_gib": line.peak_reserved_gib(self.n_layers + 1),
            }
            for variant, line in self.lines.items()
        }
        return {"n_layers": self.n_layers, "device_memory_gib": self.device_memory_gib, "margin": MARGIN,
                "capacity_gib": self.capacity_gib, "shallow_depths": list(SHALLOW_BLOCKS),
                "predicted": predicted}  # fmt: skip


def choose(lines: dict[str, Line], device_memory_gib: float, max_depth: int) -> DepthChoice:
    """One depth for every variant: the smallest of each's deepest fitting."""
    capacity = device_memory_gib * (1 - MARGIN)
    depth = min(deepest_fitting(line.peak_reserved_gib, capacity, max_depth) for line in lines.values())
    return DepthChoice(depth, device_memory_gib, capacity, lines)


def dry_run_argv(ctx: Context, name: str, overrides: list[str], depth: int, memory_gib: float) -> list[str]:
    return ctx.python("-m", "titan_train", "--config", str(RECIPE), *overrides, "--model.n_layers", str(depth),
                      "--validation.enable", "false", "--job.dump_folder", str(ctx.work / name), "--dry-run",
                      "--world-size", "1", "--device-memory-gib", f"{memory_gib:.2f}")  # fmt: skip


def start_dry_run(ctx: Context, name: str, overrides: list[str], depth: int, memory_gib: float):
    """A dry run in the background, on CPUs only (beside a training run that holds the GPU)."""
    argv = dry_run_argv(ctx, name, overrides, depth, memory_gib)
    threads = "2" if ctx.cuda else "1"  # the GPU machine has 16 cores; a CPU rehearsal may have 2
    return ctx.start(argv, name, ctx.env(OMP_NUM_THREADS=threads, TITAN_DEVICE="cpu"))


def finish_dry_run(ctx: Context, name: str, process) -> dict:
    """The dry run's rank-class entry (one rank on one device)."""
    ctx.finish(process, name)
    (entry,) = json.loads((ctx.work / name / "dry_run.json").read_text())["rank_classes"]
    return entry


def fit_depth(ctx: Context, base: list[str], variants: dict[str, list[str]], max_depth: int) -> DepthChoice:
    """Every variant's two shallow dry runs at once (CPUs only), and the depth they choose."""
    memory = device_memory_gib(ctx)
    started = {(variant, depth): start_dry_run(ctx, f"dry_{variant}_{depth}", [*base, *extra], depth, memory)
               for variant, extra in variants.items() for depth in SHALLOW_BLOCKS}  # fmt: skip
    entries = {key: finish_dry_run(ctx, f"dry_{key[0]}_{key[1]}", process) for key, process in started.items()}
    near, far = SHALLOW_BLOCKS
    lines = {variant: Line(entries[variant, near], entries[variant, far]) for variant in variants}
    return choose(lines, memory, max_depth)
