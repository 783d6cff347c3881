"""The TorchTitan paper's Table 1 on one GPU: Llama 3.1 8B's width (dim 4096, FFN 14336: the paper's matmuls)
with as many of its 32 blocks as the device holds, local batch 2 x 8,192 tokens, selective AC, bf16 mixed
precision; bf16 eager, compiled, compiled + Float8 (tensorwise scaling), one titan-train run each, their
tokens/s ratios beside the paper's (8 H100s under FSDP: 5,762, 6,667 and 8,532 tokens/s per GPU).

The depth is the dry run's (fit_depth.py): the deepest whose predicted reserved peak leaves 10% of the
device's memory free, for bf16 and for Float8, the smaller for all three variants; the full-depth dry run of
that choice runs on CPUs beside the eager run, and its predicted peak active memory is set against the eager
run's. If Float8 does not pay as the paper's did, a short compiled + Float8 run under the trainer's profiler
(CUDA only) says where its step goes: its largest kernels, matmuls against casts and amax reductions.

The CPU rehearsal trains the tiny8 model in float32 (compile backend aot_eager, Float8 emulated) at the depth the
same dry runs choose: it proves the driver, not the claim."""

from __future__ import annotations

from bench_loss import kernel_summary
from gpu_checks.checks import claim
from gpu_checks.context import CheckFailed, Context
from gpu_checks.fit_depth import SHALLOW_BLOCKS, DepthChoice, finish_dry_run, fit_depth, start_dry_run
from gpu_checks.memory import device_memory_gib
from gpu_checks.training import (
    COMPILE,
    EIGHT_B_WIDTH_CUDA,
    EMULATED,
    FLOAT8,
    ONE_B_CPU,
    float8_is_real,
    peak_memory,
    speedups,
    steady,
    train,
)

PAPER_TOKENS_PER_S = {"eager": 5762, "compiled": 6667, "compiled_float8": 8532}  # Table 1: 8B, 8 H100s, FSDP
RATIOS = {"compiled_vs_eager": "compile_ratio", "compiled_float8_vs_compiled": "float8_ratio"}
# The paper's setting at 8B width (later overrides win): 9 steps, the first 3 warm-up (steady() leaves them out).
TABLE1_CUDA = [*EIGHT_B_WIDTH_CUDA, "--training.seq_len", "8192", "--training.steps", "9"]
TABLE1_CPU = [*ONE_B_CPU, "--model.flavor", "tiny8"]  # 8 blocks: deeper than the shallow dry runs
PROFILE = ["--training.steps", "4", "--profiling.enable_profiling", "true", "--profiling.profile_freq", "4",
           "--profiling.profile_warmup", "1", "--profiling.profile_active", "1"]  # step 4 traced  # fmt: skip
TOP_KERNELS = 12
# What a kernel's name says it does (CUDA: cuBLAS/cuBLASLt/CUTLASS matmuls, flash attention, inductor's fused
# triton kernels named after the ops they fuse). Float8's own work is the scaled matmuls and the casts to float8
# with their amax reductions.
KINDS = (
    ("float8 matmul", ("e4m3", "e5m2", "f8f8", "scaled_mm", "fp8")),
    ("other matmul", ("gemm", "nvjet", "cutlass", "xmma", "matmul")),  # bf16, or float8 by a name not marked so
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("cast / amax", ("amax", "to_copy", "clamp", "reciprocal", "float8")),
)


def paper_ratio(name: str) -> float:
    after, before = name.split("_vs_")
    return PAPER_TOKENS_PER_S[after] / PAPER_TOKENS_PER_S[before]


def versus_paper(ratios: dict[str, float]) -> dict:
    """Each measured ratio, the paper's, and how far ours is from it ((ours - paper) / paper)."""
    figures = {}
    for name, short in RATIOS.items():
        figures[f"paper_{name}"] = paper_ratio(name)
        if ratios.get(name) is not None:
            figures[f"{short}_vs_paper_error"] = ratios[name] / paper_ratio(name) - 1
    return figures


def variants(ctx: Context) -> dict[str, list[str]]:
    """The runs, in the paper's order (each one's overrides beyond the base)."""
    found = {"eager": [], "compiled": COMPILE, "compiled_float8": [*COMPILE, *float8_flags(ctx)]}
    if not ctx.cuda:
        ctx.note("CPU rehearsal: tiny8 model, float32, compile backend aot_eager, float8 emulated; it proves the "
                 "driver, not the claim (a tiny model's tokens/s on a shared CPU says nothing of a GPU's)")  # fmt: skip
    elif not float8_is_real():
        del found["compiled_float8"]
        ctx.claims_not_applicable("compiled_float8 skipped: float8 matmuls need sm90 (H100+)",
                                  "float8_faster_than_compiled", "float8_ratio_near_paper")  # fmt: skip
    return found


def float8_flags(ctx: Context) -> list[str]:
    return FLOAT8 if ctx.cuda else [*FLOAT8, *EMULATED]


def flavor_depth(base: list[str]) -> int:
    """The flavor's own number of blocks: the most the choice may take."""
    from titan_models import get_model_spec

    options = dict(zip(base[::2], base[1::2], strict=True))  # every option here takes a value; the last one wins
    return get_model_spec("llama3").args_for(options["--model.flavor"]).n_layers


def kind_of(kernel: str) -> str:
    lowered = kernel.lower()
    return next((kind for kind, marks in KINDS if any(m in lowered for m in marks)), "other")


def kernel_breakdown(by_name: list[tuple[str, float]], total_ms: float, step_ms: float) -> dict:
    """The largest kernels of a traced step (name, ms, share of all kernels' time, kind) and each kind's share."""
    kinds: dict[str, float] = {}
    for name, ms in by_name:
        kinds[kind_of(name)] = kinds.get(kind_of(name), 0.0) + ms
    top = [{"name": name, "ms": ms, "share": ms / total_ms if total_ms else None, "kind": kind_of(name)}
           for name, ms in by_name[:TOP_KERNELS]]  # fmt: skip
    shares = {kind: ms / total_ms for kind, ms in sorted(kinds.items(), key=lambda kv: -kv[1])} if total_ms else {}
    return {"step_ms": step_ms, "kernels_ms": total_ms, "share_by_kind": shares, "top_kernels": top}


def ratio_figures(tps: dict[str, float | None]) -> dict:
    """Each variant's tokens/s over the one before it, the paper's ratio beside it and how far ours is from it."""
    ratios = {k: v for k, v in speedups(tps).items() if k != "headline"}
    return {**ratios, **versus_paper(ratios)}


def float8_missed(figures: dict) -> bool:
    """Whether Float8 misses either of its claims (their bounds as checks.py declares them)."""
    faster, near = claim("table1", "float8_faster_than_compiled"), claim("table1", "float8_ratio_near_paper")
    measured = figures.get("compiled_float8_vs_compiled")
    return measured is not None and not (
        faster.bound.holds(measured) and near.bound.holds(figures["float8_ratio_vs_paper_error"])
    )


def profile_float8(ctx: Context, overrides: list[str]) -> None:
    """One traced step of compiled + Float8 (after a warm-up one): where the step goes, by kernel."""
    try:
        train(ctx, "compiled_float8_profile", [*overrides, *PROFILE])
        by_name, total, step = kernel_summary(ctx.work / "compiled_float8_profile" / "profile_traces", 10**6)
    except (CheckFailed, OSError, StopIteration, ValueError, KeyError) as error:  # the claims' verdict stands
        ctx.note(f"the profile of compiled + Float8 failed: {error!r}"[:2000])
        return
    breakdown = kernel_breakdown(by_name, total, step)
    ctx.record(float8_profile=breakdown)
    shares = ", ".join(f"{kind} {share:.0%}" for kind, share in breakdown["share_by_kind"].items())
    ctx.note(f"Float8 missed the paper's gain; one compiled + Float8 step's kernel time by kind: {shares} "
             f"(figures float8_profile.top_kernels name the largest)")  # fmt: skip


def record_depth(ctx: Context, choice: DepthChoice, confirmed: dict[str, dict]) -> None:
    figures = choice.figures()
    for variant, entry in confirmed.items():
        figures["predicted"][variant]["full_dry_run_peak_reserved_gib"] = entry["peak_reserved_gib"]
        figures["predicted"][variant]["full_dry_run_peak_active_gib"] = entry["peak_active_gib"]
    ctx.record(n_layers=choice.n_layers, depth=figures)


def run_variant(ctx: Context, name: str, overrides: list[str], tps: dict, peaks: dict) -> None:
    rows = train(ctx, name, overrides)
    tps[name], peaks[name] = steady(rows, "tps"), peak_memory(rows)
    ctx.record(**{f"tokens_per_s_{name}": tps[name], f"mfu_{name}": steady(rows, "mfu"),
                  f"peak_memory_gib_{name}": peaks[name]}, **ratio_figures(tps))  # fmt: skip


def table1(ctx: Context) -> None:
    base = TABLE1_CUDA if ctx.cuda else TABLE1_CPU
    runs = variants(ctx)
    dry = {"bf16": [], **({"float8": float8_flags(ctx)} if "compiled_float8" in runs else {})}
    choice = fit_depth(ctx, base, dry, flavor_depth(base))
    record_depth(ctx, choice, {})
    # The choice dry-run at full depth, on CPUs beside the eager run (unless a shallow dry run was that deep).
    memory = device_memory_gib(ctx)
    full = {v: start_dry_run(ctx, f"dry_{v}_full", [*base, *extra], choice.n_layers, memory)
            for v, extra in dry.items() if choice.n_layers not in SHALLOW_BLOCKS}  # fmt: skip
    depth = ["--model.n_layers", str(choice.n_layers)]
    tps, peaks = {}, {}
    run_variant(ctx, "eager", [*base, *depth], tps, peaks)
    confirmed = {v: finish_dry_run(ctx, f"dry_{v}_full", process) for v, process in full.items()}
    if confirmed:
        record_depth(ctx, choice, confirmed)
        if ctx.cuda and peaks["eager"]:
            ctx.compare("eager_bf16", "peak active", confirmed["bf16"]["peak_active_gib"], peaks["eager"], "GiB")
    for name, extra in list(runs.items())[1:]:
        run_variant(ctx, name, [*base, *depth, *extra], tps, peaks)
    figures = ratio_figures(tps)  # recorded after each run too: a timeout keeps the ratios measured before it
    ctx.record(**{f"paper_tokens_per_s_{n}": PAPER_TOKENS_PER_S[n] for n in runs},
               headline=headline(ctx, choice, tps, figures, peaks))  # fmt: skip
    if "compiled_float8" not in runs:
        return
    if not ctx.cuda:
        ctx.note("the profile of compiled + Float8 (on CUDA, when Float8 misses a claim) is skipped on CPU")
    elif float8_missed(figures):
        profile_float8(ctx, [*base, *depth, *runs["compiled_float8"]])


def headline(ctx: Context, choice: DepthChoice, tps: dict, figures: dict, peaks: dict) -> str:
    shown = [f"eager {tps['eager']:,.0f}"] if tps.get("eager") else []
    for name, short in RATIOS.items():
        after = name.split("_vs_")[0]
        if tps.get(after) and figures.get(name):
            shown.append(f"{after} {tps[after]:,.0f} ({figures[name]:.3f}x; paper {figures[f'paper_{name}']:.3f}x, "
                         f"{figures[f'{short}_vs_paper_error']:+.0%})")  # fmt: skip
    memory = "/".join(f"{peaks[n]:.1f}" for n in peaks)
    model = "8B width" if ctx.cuda else "tiny8 width (CPU rehearsal: not judged)"
    return f"{choice.n_layers} blocks at {model}: tok/s {', '.join(shown)}; peak GiB {memory}"
