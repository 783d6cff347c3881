"""Predicted step time against a real run on one GPU: the 1B model eager and compiled (bf16, selective AC).

The dry run predicts the step on this GPU's row of titan_debug's device table (`--gpu`, found from the
device's name; an unknown GPU is predicted as the default row, and the check says so); the same config then
trains for real and its step time is its tokens per step over its steady tokens/s. On the CPU rehearsal the
device row is this CPU, measured (step_time.cpu_device: one stream, no communication), and the model tiny.
"""

from __future__ import annotations

from gpu_checks.context import Context
from gpu_checks.training import COMPILE, ONE_B_CPU, ONE_B_CUDA, RECIPE, steady, train

# torch.cuda.get_device_name() contains the key -> the device row (first match).
GPU_ROWS = (("H200", "h200-sxm"), ("H100", "h100-sxm-80gb"), ("A100", "a100-sxm-80gb"), ("B200", "b200"),
            ("MI300X", "mi300x"))  # fmt: skip
CASES_CUDA = {"1b_eager": ONE_B_CUDA, "1b_compiled": [*ONE_B_CUDA, *COMPILE]}
CASES_CPU = {"tiny_eager": [a for a in ONE_B_CPU if a not in ("--compile.backend", "aot_eager")]}


def device_row(ctx: Context):
    from titan_debug import DEFAULT_DEVICE, cpu_device, get_device

    if not ctx.cuda:
        return cpu_device(interconnect_bandwidth=1e9)  # one rank: nothing is sent
    import torch

    name = torch.cuda.get_device_name()
    row = next((row for key, row in GPU_ROWS if key in name), None)
    if row is None:
        ctx.note(f"{name!r} has no row in titan_debug.devices: predicted as {DEFAULT_DEVICE}")
    return get_device(row or DEFAULT_DEVICE)


def predicted_seconds(ctx: Context, case: str, overrides: list[str], device) -> float:
    from titan_train.config import load_config, parse_argv
    from titan_train.simulate.dry_run import dry_run

    folder = ctx.work / f"{case}.dry"
    argv = ["--config", str(RECIPE), *overrides, "--validation.enable", "false", "--job.dump_folder", str(folder)]
    report = dry_run(load_config(parse_argv(argv)), 1, gpu=device)
    return report["step_time"]["step_seconds"]


def step_time(ctx: Context) -> None:
    device = device_row(ctx)
    cases = CASES_CUDA if ctx.cuda else CASES_CPU
    for case, overrides in cases.items():
        predicted = predicted_seconds(ctx, case, overrides, device)
        rows = train(ctx, case, overrides)
        tokens = _tokens_per_step(overrides)
        ctx.compare(case, "step seconds", predicted, tokens / steady(rows, "tps"), "s")
    ctx.record(
        device=device.name,
        headline="; ".join(f"{c['case']} {c['rel_error']:+.1%}" for c in ctx.comparisons),
    )


def _tokens_per_step(overrides: list[str]) -> int:
    from titan_train.config import load_config, parse_argv

    config = load_config(parse_argv(["--config", str(RECIPE), *overrides]))
    return config.training.local_batch_size * config.training.seq_len
