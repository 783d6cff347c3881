"""Titan side by side with TorchTitan on the same machine: the same shapes (Llama 3.1 8B's width and
Qwen3-30B-A3B's at 2 layers on a GPU; TorchTitan's debug models on CPU), batch, dtype (bf16 parameters, fp32
reductions), selective AC, per-block compile and FSDP2 on both sides, run alternately (Titan, TorchTitan,
Titan, TorchTitan), each run in its own processes (gpu_checks.side_by_side_driver); the median tokens/s after
warm-up and the peak memory, Titan over TorchTitan. The CPU rehearsal runs one process (compiled with
aot_eager) and FSDP 2 on gloo (eager), float32, one round.

Each side's model class and parameter count are recorded (the shapes must match), and so is every bypass
applied to TorchTitan (side_by_side_torchtitan says why each is needed)."""

from __future__ import annotations

import json
import os
import statistics
import time
import zipfile
from pathlib import Path

from gpu_checks import ROOT
from gpu_checks.context import CheckFailed, Context, tail

MODELS = ("dense", "moe")
WHEELS = ".whl"  # tools/gpu_check_offline.sh's folder
SIDES = ("titan", "torchtitan")
ROUNDS = {True: 2, False: 1}  # cuda -> rounds of (Titan, TorchTitan)
WORLDS = {True: (1,), False: (1, 2)}  # one GPU; the rehearsal also shards over 2 gloo processes
STEPS = {True: ("3", "5"), False: ("1", "2")}  # (warm-up, measured)
# A second round only if it should end this long before the runner's deadline (the check's budget, checks.py):
# what is left to do after the last round (the figures, the processes' teardown) with room for a slower round.
ROUND_MARGIN_S = 50
PARAMS_RTOL = 0.0  # both sides build the same shapes: the same parameter count


def fallback_wheel() -> Path | None:
    """The older TorchTitan carried beside the newest (tools/gpu_check_offline.sh puts it in .whl/fallback/)."""
    wheels = sorted((ROOT / WHEELS / "fallback").glob("torchtitan-*.whl"))
    return wheels[-1] if wheels else None


def unpacked(ctx: Context, wheel: Path) -> Path:
    """A pure-python wheel unpacked into WORK, put first on the driver's path (the newest stays installed)."""
    target = ctx.work / wheel.stem
    if not target.exists():
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target)
    return target


def run_torchtitan(ctx: Context, model: str, world: int, name: str, state: dict) -> dict:
    """TorchTitan's side with the installed release; if that fails (it may need a newer torch than the
    machine's), with the carried fallback from then on, saying why."""
    if "path" not in state:
        try:
            return run_side(ctx, "torchtitan", model, world, name)
        except CheckFailed as failure:
            wheel = fallback_wheel()
            if wheel is None:
                raise
            state["path"] = str(unpacked(ctx, wheel))
            why = error_line((ctx.work / f"{name}.log").read_text(errors="replace")) or tail(str(failure), 6)
            ctx.note(f"the installed TorchTitan failed ({why}); {wheel.name} runs instead")
            ctx.record(torchtitan_fallback=wheel.name, torchtitan_fallback_reason=why)
            name = f"{name}_fallback"
    env = ctx.env()
    env["PYTHONPATH"] = os.pathsep.join((state["path"], env["PYTHONPATH"]))
    return run_side(ctx, "torchtitan", model, world, name, env)


def error_line(log: str) -> str:
    """The exception a rank raised (torchrun's own summary after it says nothing about the cause)."""
    lines = [line for line in log.splitlines() if "Error" in line or "Exception" in line]
    ranked = [line for line in lines if line.startswith("[rank")]
    return (ranked or lines or [""])[-1].strip()


def run_side(ctx: Context, side: str, model: str, world: int, name: str, env: dict | None = None) -> dict:
    out = ctx.work / f"{name}.json"
    warmup, steps = STEPS[ctx.cuda]
    argv = ctx.python("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
                      "-m", "gpu_checks.side_by_side_driver", "--side", side, "--model", model, "--out", str(out),
                      "--warmup", warmup, "--steps", steps)  # fmt: skip
    if ctx.cuda:
        argv += ["--compile-backend", "inductor"]
    else:  # both sides' compile paths rehearsed where the GPU compiles (one process), with no code generated
        argv += ["--cpu", *(["--compile-backend", "aot_eager"] if world == 1 else [])]
    ctx.run(argv, name, env)
    return json.loads(out.read_text())


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def side_by_side(ctx: Context) -> None:
    """Every model's first round before any second one, so both ratios are recorded early; a second round only
    where its first round's duration says it ends ROUND_MARGIN_S before the check's deadline."""
    runs: dict[tuple[str, int, str], list[dict]] = {}
    fallback: dict = {}  # the fallback TorchTitan's path, once the installed one has failed
    took: dict[tuple[str, int], float] = {}
    for world in WORLDS[ctx.cuda]:
        for round_ in range(ROUNDS[ctx.cuda]):
            for model in MODELS:
                began = time.monotonic()
                if round_ and took[(model, world)] > ctx.seconds_left() - ROUND_MARGIN_S:
                    ctx.note(f"{model}: one round only (a second would end less than {ROUND_MARGIN_S} s before "
                             f"the check's deadline)")  # fmt: skip
                    continue
                for side in SIDES:
                    name = f"{model}_w{world}_{side}_{round_}"
                    if side == "titan":
                        result = run_side(ctx, side, model, world, name)
                    else:
                        result = run_torchtitan(ctx, model, world, name, fallback)
                    runs.setdefault((model, world, side), []).append(result)
                took.setdefault((model, world), time.monotonic() - began)
                record(ctx, runs, model, world)


def record(ctx: Context, runs: dict, model: str, world: int) -> None:
    """One model's figures at one world size: each side's median tokens/s over its rounds, peaks, and ratios."""
    titan, torchtitan = runs[(model, world, "titan")], runs[(model, world, "torchtitan")]
    suffix = "" if world == 1 else f"_fsdp{world}"
    tps = {side: statistics.median(r["tokens_per_s"] for r in rs)
           for side, rs in (("titan", titan), ("torchtitan", torchtitan))}  # fmt: skip
    first_t, first_tt = titan[0], torchtitan[0]
    if abs(first_t["params"] - first_tt["params"]) > PARAMS_RTOL * first_tt["params"]:
        raise CheckFailed(f"{model}: the shapes differ: Titan {first_t['params']:,} parameters, TorchTitan "
                          f"{first_tt['params']:,}")  # fmt: skip
    figures = {
        f"titan_vs_torchtitan_tokens_{model}{suffix}": ratio(tps["titan"], tps["torchtitan"]),
        f"titan_vs_torchtitan_peak_allocated_{model}{suffix}": ratio(first_t["peak_allocated_gib"],
                                                                     first_tt["peak_allocated_gib"]),
        f"titan_vs_torchtitan_peak_reserved_{model}{suffix}": ratio(first_t["peak_reserved_gib"],
                                                                    first_tt["peak_reserved_gib"]),
        f"{model}{suffix}": {
            "titan": side_figures(titan),
            "torchtitan": {**side_figures(torchtitan), "bypasses": first_tt["bypasses"]},
            "shape": first_t["shape"], "world": world, "param_dtype": first_t["param_dtype"],
            "ac": first_t["ac"], "compile_backend": first_t["compile_backend"],
        },
    }  # fmt: skip
    for bypass in first_tt["bypasses"]:
        if bypass not in ctx.notes:
            ctx.note(bypass)
    ctx.record(**figures, torchtitan_version=first_tt["version"])
    ctx.record(headline=headline(ctx.figures))


def side_figures(rs: list[dict]) -> dict:
    first = rs[0]
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
            "tokens_per_s_rounds": [r["tokens_per_s"] for r in rs], "version": first["version"],
            "model_class": first["model_class"], "params": first["params"], "attention": first["attention"],
            "peak_allocated_gib": first["peak_allocated_gib"],
            "peak_reserved_gib": first["peak_reserved_gib"]}  # fmt: skip


def headline(figures: dict) -> str:
    """Every model's ratios so far, in the order they were measured."""
    parts = []
    for key, tokens in figures.items():
        if key.startswith("titan_vs_torchtitan_tokens_") and tokens:
            case = key.removeprefix("titan_vs_torchtitan_tokens_")
            peak = figures.get(f"titan_vs_torchtitan_peak_allocated_{case}")
            parts.append(f"{case.replace('_', ' ')}: Titan / TorchTitan {tokens:.2f}x tok/s"
                         + (f", {peak:.2f}x peak" if peak else ""))  # fmt: skip
    return f"TorchTitan {figures.get('torchtitan_version', '?')}; " + "; ".join(parts)
