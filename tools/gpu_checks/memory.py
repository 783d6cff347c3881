"""Dry-run memory against reality on one GPU. For each config, `titan-train --dry-run --world-size 1` predicts
the peak active and reserved bytes (dry_run.json); the same config then runs for real in a fresh process
(memory_driver.py: the Trainer on synthetic batches, the same number of steps) and torch.cuda reports
max_memory_allocated and max_memory_reserved. The dry runs need only CPUs, so they all start first and run
beside the real runs, which take the GPU one at a time.

On the CPU rehearsal the real side is what a CPU can measure: the peak active bytes under titan-debug's
AllocationTracker (no reserved figure: a CPU has no caching allocator)."""

from __future__ import annotations

import json

from gpu_checks.context import CheckFailed, Context
from gpu_checks.training import BF16, COMPILE, RECIPE, SELECTIVE_AC

GIB = 1024**3
CPU_DEVICE_GIB = 80  # the dry run's default: an H100

DEBUG_CUDA = {"debug_b32_s2048": ["--training.local_batch_size", "32", "--training.seq_len", "2048", *BF16]}
DEBUG_CPU = {"tiny_b8_s256": ["--model.flavor", "tiny", "--training.local_batch_size", "8",
                              "--training.seq_len", "256"]}  # fmt: skip
ONE_B = ["--model.flavor", "1B", "--training.local_batch_size", "2", "--training.seq_len", "2048", *BF16]
ONE_B_CUDA = {
    "1b_ac_op": [*ONE_B, *SELECTIVE_AC],
    "1b_no_ac": ONE_B,
    "1b_ac_op_compiled": [*ONE_B, *SELECTIVE_AC, *COMPILE],
}
# The rehearsal runs the case that takes the most code paths (AC, compile's note) at a small size: on 2 cores each
# case costs two processes' start-up.
ONE_B_CPU = {
    "tiny8_ac_op_compiled": ["--model.flavor", "tiny8", "--training.local_batch_size", "4", "--training.seq_len",
                             "128", *SELECTIVE_AC, *COMPILE, "--compile.backend", "aot_eager"],
}  # fmt: skip


def device_memory_gib(ctx: Context) -> float:
    if not ctx.cuda:
        return CPU_DEVICE_GIB
    import torch

    return torch.cuda.get_device_properties(0).total_memory / GIB


def config_args(ctx: Context, case: str, overrides: list[str], side: str) -> list[str]:
    folder = ctx.work / f"{case}.{side}"
    return ["--config", str(RECIPE), *overrides, "--validation.enable", "false", "--job.dump_folder", str(folder)]


def compare_cases(ctx: Context, cases: dict[str, list[str]]) -> None:
    """Start every dry run, then per case: the real measurement, its dry run's report, the comparison (recorded
    at once, so a timeout keeps the cases done)."""
    memory = device_memory_gib(ctx)
    dry_runs = {}
    for case, overrides in cases.items():
        argv = ctx.python("-m", "titan_train", *config_args(ctx, case, overrides, "dry"), "--dry-run",
                          "--world-size", "1", "--device-memory-gib", f"{memory:.2f}")  # fmt: skip
        dry_runs[case] = ctx.start(argv, f"{case}.dry", ctx.env(OMP_NUM_THREADS="2", TITAN_DEVICE="cpu"))  # CPUs only
    failures = []
    for case, overrides in cases.items():
        out = ctx.work / f"{case}.real.json"
        driver = ctx.python("-m", "gpu_checks.memory_driver", str(out), *config_args(ctx, case, overrides, "real"))
        try:
            ctx.run(driver, f"{case}.real")
            ctx.finish(dry_runs[case], f"{case}.dry")
        except CheckFailed as failure:
            failures.append(str(failure))
            continue
        report = json.loads((ctx.work / f"{case}.dry" / "dry_run.json").read_text())
        record_case(ctx, case, report, json.loads(out.read_text()))
        ctx.record(headline="; ".join(f"{c['case']} {c['quantity']} {c['rel_error']:+.1%}" for c in ctx.comparisons))
    if failures:
        raise CheckFailed("; ".join(failures))


def record_case(ctx: Context, case: str, report: dict, real: dict) -> None:
    (rank_class,) = report["rank_classes"]
    ctx.compare(case, "peak active", rank_class["peak_active_gib"], real["peak_active_bytes"] / GIB, "GiB")
    if real.get("peak_reserved_bytes") is not None:
        ctx.compare(case, "peak reserved", rank_class["peak_reserved_gib"], real["peak_reserved_bytes"] / GIB, "GiB")
    ctx.record(**{case: {"dry_run": rank_class, "real": real, "allocator": report["allocator"]}})
    for line in report.get("unsupported", []) + [u for u in report.get("unmodelled", []) if "compile" in u]:
        ctx.note(f"{case}: {line}")


def memory_debug(ctx: Context) -> None:
    compare_cases(ctx, DEBUG_CUDA if ctx.cuda else DEBUG_CPU)


def memory_1b(ctx: Context) -> None:
    compare_cases(ctx, ONE_B_CUDA if ctx.cuda else ONE_B_CPU)
