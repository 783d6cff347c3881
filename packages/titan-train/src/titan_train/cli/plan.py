"""`titan-train plan --config R --gpus N [--gpu NAME] [--section.key value ...]`: the fastest layout of recipe R
on N GPUs (plan/planner.py), as a table, <dump_folder>/plan.json and <dump_folder>/plan_best.toml."""

from __future__ import annotations

import os
import time
from pathlib import Path

from titan_train.cli.command import EXIT_OK, UsageError
from titan_train.cli.dry_run_options import HELP as DRY_RUN_HELP
from titan_train.cli.dry_run_options import split_dry_run_options
from titan_train.config import ConfigError, load_config, parse_argv

USAGE = """usage: titan-train plan --config RECIPE --gpus N [options] [--section.key value ...]

Enumerates layouts of RECIPE on N GPUs (data-parallel replicate x shard, tensor parallel within a node,
pipeline parallel with its schedules and micro-batches, context parallel, activation checkpointing, local
batch, chunked loss), drops those the config checks refuse or a memory lower bound puts over the GPU's memory,
dry-runs the rest (plan/planner.py: per family, from the least recompute up) and ranks what fits by
predicted tokens/s per GPU. The model, sequence length and global batch are the recipe's (override them like
any key, e.g. --training.seq_len 16384). Writes <dump_folder>/plan.json (every layout and what became of it)
and <dump_folder>/plan_best.toml (the first choice, a recipe extending RECIPE).

options:
  --gpus N              the number of GPUs to plan for (required)
  --budget-minutes M    start no dry run that would end after M minutes (default: 3 for the GPUs of one node,
                        10 for more); the layouts not reached are listed
  --jobs J              dry runs at once (default: the number of cores)
  --top K               rows of the table (default 10)
  --no-cache            simulate again what <dump_folder>/plan_cache holds
  --exhaustive          dry-run every layout the memory bound leaves, in each family up to the first lever that
                        fits (no time budget, no memory estimate): slow, exact
  --full-depth          dry-run every layout at the model's full depth (default: a deep model's layouts at 2 and
                        4 blocks per rank, extrapolated per block, the first choice dry-run again at full depth)
"""
for flag in ("--gpu NAME", "--gpu-override KEY=VALUE", "--device-memory-gib G"):
    USAGE += f"  {flag:<22}{DRY_RUN_HELP[flag].removeprefix('with --dry-run: ')}\n"


def _take(argv: list[str], flag: str, convert, default):
    """The value of `--flag V` / `--flag=V` (removed from argv), converted, or the default."""
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name != flag:
            continue
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise ConfigError(f"command line: {flag} needs a value")
            value = argv.pop(i + 1)
        argv.pop(i)
        try:
            number = convert(value)
        except ValueError:
            number = None
        if number is None or number <= 0:
            raise ConfigError(f"command line: {flag} {value!r}: expected a number > 0")
        return number
    return default


def main(argv: list[str]) -> int:
    argv = list(argv)
    if not argv or "--help" in argv or "-h" in argv:
        print(USAGE)
        return EXIT_OK
    gpus = _take(argv, "--gpus", int, None)
    budget_minutes = _take(argv, "--budget-minutes", float, None)
    jobs = _take(argv, "--jobs", int, os.cpu_count() or 1)
    top = _take(argv, "--top", int, 10)
    use_cache, exhaustive, full_depth = "--no-cache" not in argv, "--exhaustive" in argv, "--full-depth" in argv
    argv = [a for a in argv if a not in ("--no-cache", "--exhaustive", "--full-depth")]
    if gpus is None:
        raise UsageError("plan: --gpus N is required (the number of GPUs to plan for)")
    dry, argv = split_dry_run_options(argv)
    for flag, given in (("--dry-run", dry.enabled), ("--world-size", dry.world_size is not None)):
        if given:
            raise ConfigError(f"command line: {flag} is not a plan option (the plan's world is --gpus)")
    cmd = parse_argv(argv)
    if not cmd.config_file:
        raise UsageError("plan: --config RECIPE is required (the recipe whose layout is planned)")
    config = load_config(cmd)
    gpu = dry.gpu_spec(config.dry_run.gpu)
    from titan_train.plan.plan_report import format_table, write_best_recipe, write_plan
    from titan_train.plan.planner import Planner, PlanSettings, ranked

    folder = Path(config.job.dump_folder)
    settings = PlanSettings(
        gpus=gpus,
        gpu=gpu,
        device_memory_gib=dry.device_memory_gib or gpu.memory_gib,
        budget_seconds=60 * (budget_minutes or (3 if gpus <= gpu.gpus_per_node else 10)),
        jobs=jobs,
        cache_folder=folder / "plan_cache" if use_cache else None,
        exhaustive=exhaustive,
        full_depth=full_depth,
    )
    start = time.perf_counter()
    outcomes = Planner(config, settings).plan()
    write_plan(outcomes, settings, cmd.config_file, folder, time.perf_counter() - start)
    print(format_table(outcomes, settings, top))
    best = ranked(outcomes, runnable_here=True)
    if not best:
        print(f"# no layout fits {settings.device_memory_gib:g} GiB; {folder / 'plan.json'} says why for each")
        return EXIT_OK
    kept = [key for key in cmd.overrides if key != "job.dump_folder"]  # where the plan went, not the run
    recipe = write_best_recipe(best[0], settings, cmd.config_file, config, kept, folder)
    print(f"# wrote {folder / 'plan.json'} and {recipe} (train it: titan-train --config {recipe})")
    return EXIT_OK
