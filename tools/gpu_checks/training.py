"""Training checks through the real entry point (`python -m titan_train` with `--section.key value`
overrides), read back from `<dump_folder>/metrics.jsonl`: the debug model with every single-GPU feature at once,
and the 1B model's tokens/s in the paper's Table 1 order (eager, compiled, compiled + Float8), Float8 again at
the 8B model's width."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from gpu_checks import ROOT
from gpu_checks.context import CheckFailed, Context

RECIPE = ROOT / "configs" / "debug_model.toml"
BF16 = ["--training.mixed_precision_param", "bfloat16"]
COMPILE = ["--compile.enable", "true"]
SELECTIVE_AC = ["--activation_checkpoint.mode", "selective"]
FLOAT8 = ["--float8.enable", "true"]
EMULATED = ["--float8.emulate", "true"]
LOSS_FALLS_BY = 0.02  # the mean of the last 3 logged losses at least 2% under the mean of the first 3
WARMUP_STEPS = 3  # steps left out of tokens/s and MFU (compilation, allocator warm-up)

DEBUG_CUDA = ["--training.steps", "40", "--training.local_batch_size", "16", "--training.seq_len", "1024",
              *BF16, *COMPILE, *SELECTIVE_AC, *FLOAT8, "--training.loss_chunk_tokens", "2048"]  # fmt: skip
DEBUG_CPU = ["--model.flavor", "tiny", "--training.steps", "20", "--training.local_batch_size", "4",
             "--training.seq_len", "64", *SELECTIVE_AC, *FLOAT8, *EMULATED, "--training.loss_chunk_tokens", "64",
             "--lr_scheduler.warmup_steps", "2", "--optimizer.lr", "3e-3"]  # fmt: skip

ONE_B_CUDA = ["--model.flavor", "1B", "--training.steps", "12", "--training.local_batch_size", "2",
              "--training.seq_len", "2048", *BF16, *SELECTIVE_AC]  # fmt: skip
ONE_B_CPU = ["--model.flavor", "tiny", "--training.steps", "8", "--training.local_batch_size", "4",
             "--training.seq_len", "64", *SELECTIVE_AC, "--compile.backend", "aot_eager"]  # fmt: skip
# Llama 3.1 8B's width (dim 4096, FFN 14336: the matmuls of the paper's Table 1) at 4 of its 32 layers, so one
# GPU holds it and Float8's matmuls are most of the step's.
EIGHT_B_WIDTH_CUDA = ["--model.flavor", "8B", "--model.n_layers", "4", "--training.steps", "10",
                      "--training.local_batch_size", "2", "--training.seq_len", "4096", *BF16,
                      *SELECTIVE_AC]  # fmt: skip
PLAIN_LOSS = ["--training.loss_chunk_tokens", "0"]
THROUGHPUT_VARIANTS = {"eager": [], "compiled": COMPILE, "compiled_float8": [*COMPILE, *FLOAT8]}


def float8_is_real() -> bool:
    """Real float8 matmuls (torch._scaled_mm) need FP8 tensor cores: sm89 and up; Titan targets sm90 (H100+)."""
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


def read_metrics(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train(ctx: Context, name: str, overrides: list[str], recipe: Path = RECIPE) -> list[dict]:
    """One titan-train run of `recipe` in WORK/NAME; its metrics rows (one per step)."""
    folder = ctx.work / name
    argv = ctx.python("-m", "titan_train", "--config", str(recipe), *overrides, "--job.dump_folder", str(folder),
                      "--validation.enable", "false", "--metrics.log_freq", "1")  # fmt: skip
    ctx.run(argv, name)
    rows = read_metrics(folder)
    if not rows:
        raise CheckFailed(f"{name}: titan-train exited 0 but wrote no metrics to {folder / 'metrics.jsonl'}")
    return rows


def steady(rows: list[dict], key: str) -> float | None:
    """The median of `key` over the steps after warm-up (all steps if there are too few)."""
    values = [r[key] for r in rows[WARMUP_STEPS:] or rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def peak_memory(rows: list[dict]) -> float:
    """The largest `memory` (GiB: max allocated on CUDA) any step logged; 0 where none did."""
    return max(r.get("memory") or 0.0 for r in rows)


def loss_trend(rows: list[dict]) -> tuple[float, float, bool]:
    losses = [r["loss"] for r in rows]
    first, last = statistics.fmean(losses[:3]), statistics.fmean(losses[-3:])
    return first, last, last <= first * (1 - LOSS_FALLS_BY)


def peak_tflops() -> float | None:
    """The datasheet dense bf16 peak the MFU is against (None on CPU, where it is a measured probe)."""
    import torch

    if not torch.cuda.is_available():
        return None
    from titan_debug import peak_flops

    peak = peak_flops(torch.device("cuda"), torch.bfloat16)
    return peak / 1e12 if peak else None


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def train_debug(ctx: Context) -> None:
    overrides = DEBUG_CUDA if ctx.cuda else DEBUG_CPU
    float8 = "real" if ctx.cuda and float8_is_real() else "emulated"
    if ctx.cuda and float8 == "emulated":
        overrides = [*overrides, *EMULATED]
        ctx.note("float8 emulated: this GPU has no FP8 tensor cores Titan targets (sm90+)")
    rows = train(ctx, "debug", overrides)
    first, last, falls = loss_trend(rows)
    tps, mfu, peak = steady(rows, "tps"), steady(rows, "mfu"), peak_tflops() if ctx.cuda else None
    memory = peak_memory(rows)
    ctx.record(
        steps=len(rows), loss_first3=first, loss_last3=last, loss_falls=falls, tokens_per_s=tps, mfu=mfu,
        peak_tflops_bf16=peak, peak_memory_gib=memory, float8=float8, overrides=" ".join(overrides),
        losses=[r["loss"] for r in rows],
        headline=f"loss {first:.3f} -> {last:.3f}, {tps:,.0f} tok/s, MFU {_percent(mfu)}"
        f"{f' of {peak:.0f} TFLOP/s' if peak else ''}, float8 {float8}, peak {memory:.2f} GiB",
    )  # fmt: skip
    if not falls:
        raise CheckFailed(f"the loss did not fall by {LOSS_FALLS_BY:.0%}: {first:.4f} -> {last:.4f}")


def throughput_1b(ctx: Context) -> None:
    base = ONE_B_CUDA if ctx.cuda else ONE_B_CPU
    variants = dict(THROUGHPUT_VARIANTS)
    if not ctx.cuda:
        variants["compiled_float8"] = [*COMPILE, *FLOAT8, *EMULATED]
        ctx.note("CPU rehearsal: tiny model, float32, compile backend aot_eager, float8 emulated")
    elif not float8_is_real():
        del variants["compiled_float8"]
        ctx.claims_not_applicable("compiled_float8 skipped: float8 matmuls need sm90 (H100+)",
                                  "float8_faster_at_8b_width")  # fmt: skip
    tps, peaks = {}, {}
    for name, extra in variants.items():
        rows = train(ctx, name, [*base, *extra])
        tps[name], peaks[name] = steady(rows, "tps"), peak_memory(rows)
        ctx.record(**{f"tokens_per_s_{name}": tps[name], f"mfu_{name}": steady(rows, "mfu")}, **speedups(tps))
    if "compiled_float8" in variants:
        float8_at_8b_width(ctx, variants["compiled_float8"])
    # The default loss (chunked, gradients in forward) against the plain loss, compiled: the memory-lean loss
    # should cost no throughput (tools/bench_loss.py measures more variants).
    rows = train(ctx, "compiled_plain_loss", [*base, *COMPILE, *PLAIN_LOSS])
    plain_tps, plain_peak = steady(rows, "tps"), peak_memory(rows)
    figures = speedups(tps)
    if width_ratio := ctx.figures.get("compiled_float8_vs_compiled_8b_width"):
        figures["headline"] += f"; 8B width: compiled_float8 / compiled {width_ratio:.2f}x"
    figures["headline"] += f"; default loss / plain loss {tps['compiled'] / plain_tps:.2f}x tok/s"
    ctx.record(
        tokens_per_s_compiled_plain_loss=plain_tps, chunked_loss_vs_plain_tokens=tps["compiled"] / plain_tps,
        chunked_loss_vs_plain_peak=peaks["compiled"] / plain_peak if plain_peak else None, **figures,
    )  # fmt: skip


def float8_at_8b_width(ctx: Context, float8: list[str]) -> None:
    """Compiled bf16 against compiled + Float8 where the matmuls are as large as the paper's (the CPU rehearsal:
    the tiny model again, the driver only)."""
    base = EIGHT_B_WIDTH_CUDA if ctx.cuda else ONE_B_CPU
    tps = {name: steady(train(ctx, f"8b_width_{name}", [*base, *extra]), "tps")
           for name, extra in (("compiled", COMPILE), ("compiled_float8", float8))}  # fmt: skip
    ratio = tps["compiled_float8"] / tps["compiled"] if tps["compiled"] and tps["compiled_float8"] else None
    ctx.record(tokens_per_s_8b_width_compiled=tps["compiled"],
               tokens_per_s_8b_width_compiled_float8=tps["compiled_float8"],
               compiled_float8_vs_compiled_8b_width=ratio)  # fmt: skip


def speedups(tps: dict[str, float]) -> dict:
    """Each variant's tokens/s over the one before it, and whether each step of the order is faster."""
    names = list(tps)
    ratios = {f"{b}_vs_{a}": tps[b] / tps[a] for a, b in zip(names, names[1:], strict=False) if tps[a] and tps[b]}
    order = all(r > 1 for r in ratios.values()) if ratios else None
    shown = ", ".join(f"{n} {tps[n]:,.0f}" for n in names if tps[n] is not None)
    ratio_text = ", ".join(f"{k.replace('_vs_', ' / ')} {v:.2f}x" for k, v in ratios.items())
    return {**ratios, "faster_in_table1_order": order, "headline": f"tok/s {shown}; {ratio_text}"}
