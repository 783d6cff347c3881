"""Tokens/s and peak memory of the plain loss against the chunked loss, through the real trainer, as ratios
measured in one run (variants interleaved round by round), eager and compiled:

    python tools/bench_loss.py                                # CUDA: Llama 3.2 1B, bf16, batch 2 x 2048
    python tools/bench_loss.py --flavor tiny --batch 4 --seq 64 --steps 8 --modes eager   # CPU smoke size
    python tools/bench_loss.py --profile                      # and where each variant's step spends its time

Variants: `plain` (training.loss_chunk_tokens 0), `in_forward` (the chunk, gradients computed in forward),
`recompute` (the chunk, each chunk's logits recomputed in backward). tokens/s is the median over the steps
after warm-up of `tps` in metrics.jsonl; memory the step's peak (`memory`, max allocated on CUDA).
With --profile each variant also runs once under torch.profiler and the kernels (CUDA) or top-level ops
(CPU) of one step are summed by name: the largest, and their total against the step's wall time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the gpu_checks package beside this file
from gpu_checks import ROOT  # noqa: E402
from gpu_checks.training import peak_memory, read_metrics, steady  # noqa: E402  (tokens/s as the GPU check reads it)

RECIPE = ROOT / "configs" / "debug_model.toml"
VARIANTS = {
    "plain": ["--training.loss_chunk_tokens", "0"],
    "in_forward": ["--training.loss_chunk_gradients", "in_forward"],
    "recompute": ["--training.loss_chunk_gradients", "recompute"],
}
MODES = {"eager": [], "compiled": ["--compile.enable", "true"]}


def train(folder: Path, overrides: list[str]) -> list[dict]:
    argv = [sys.executable, "-m", "titan_train", "--config", str(RECIPE), *overrides,
            "--job.dump_folder", str(folder), "--validation.enable", "false", "--metrics.log_freq", "1",
            "--checkpoint.enable", "false"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True)
    (folder.parent / f"{folder.name}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        sys.exit(f"{folder.name}: titan-train exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    return read_metrics(folder)


def kernel_summary(trace_folder: Path, top: int) -> tuple[list[tuple[str, float]], float, float]:
    """(the `top` largest (name, ms) summed over the traced step, all kernels' ms, the step's wall ms)."""
    trace = json.loads(next(trace_folder.rglob("*trace.json")).read_text())
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if not kernels:  # CPU: the outermost aten ops of each thread (an op's children are inside its time)
        kernels = _outermost([e for e in events if e.get("cat") == "cpu_op" and e["name"].startswith("aten::")])
    by_name = Counter()
    for e in kernels:
        by_name[e["name"][:90]] += e["dur"] / 1000
    steps = [e for e in events if e["name"].startswith("ProfilerStep")]
    wall = sum(e["dur"] for e in steps) / 1000 if steps else float("nan")
    return by_name.most_common(top), sum(by_name.values()), wall


def _outermost(events: list[dict]) -> list[dict]:
    kept, ends = [], {}  # thread -> where the last kept event ends
    for e in sorted(events, key=lambda e: (e["tid"], e["ts"], -e["dur"])):
        if e["ts"] >= ends.get(e["tid"], float("-inf")):
            kept.append(e)
            ends[e["tid"]] = e["ts"] + e["dur"]
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flavor", default="1B")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--chunk", default="auto", help="training.loss_chunk_tokens of the chunked variants")
    parser.add_argument("--dtype", default="bfloat16", help="training.mixed_precision_param")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--profile-modes", nargs="+", default=["eager"], choices=list(MODES))
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_loss_"))
    base = ["--model.flavor", args.flavor, "--training.local_batch_size", str(args.batch),
            "--training.seq_len", str(args.seq), "--training.steps", str(args.steps),
            "--training.mixed_precision_param", args.dtype, "--training.loss_chunk_tokens", args.chunk,
            "--activation_checkpoint.mode", "selective"]  # fmt: skip
    print(f"# {args.flavor}, batch {args.batch} x {args.seq}, {args.dtype}, chunk {args.chunk}, work {work}")
    tps: dict[tuple[str, str], list[float]] = {}
    memory: dict[tuple[str, str], float] = {}
    for round_ in range(args.rounds):
        for mode in args.modes:
            for variant in args.variants:
                rows = train(work / f"{mode}_{variant}_{round_}", [*base, *MODES[mode], *VARIANTS[variant]])
                tps.setdefault((mode, variant), []).append(steady(rows, "tps"))
                memory[(mode, variant)] = peak_memory(rows)
                losses = " ".join(f"{r['loss']:.4f}" for r in rows[-3:])
                print(f"  {mode:8s} {variant:10s} round {round_}: {tps[(mode, variant)][-1]:,.0f} tok/s, "
                      f"last losses {losses}", flush=True)  # fmt: skip
    print("\n| mode | loss | tokens/s | vs plain | peak GiB | vs plain |\n|---|---|---:|---:|---:|---:|")
    for mode in args.modes:
        plain = (mode, "plain")
        for variant in args.variants:
            key = (mode, variant)
            best = max(tps[key])
            ratio = best / max(tps[plain]) if plain in tps else float("nan")
            mem_ratio = memory[key] / memory[plain] if memory.get(plain) else float("nan")
            print(f"| {mode} | {variant} | {best:,.0f} | {ratio:.3f} | {memory[key]:.2f} | {mem_ratio:.3f} |")
    if not args.profile:
        return
    profile = ["--profiling.enable_profiling", "true", "--profiling.profile_freq", str(args.steps),
               "--profiling.profile_warmup", "3", "--profiling.profile_active", "1"]  # fmt: skip
    for mode in args.profile_modes:
        for variant in args.variants:
            folder = work / f"profile_{mode}_{variant}"
            train(folder, [*base, *MODES[mode], *VARIANTS[variant], *profile])
            top, total, wall = kernel_summary(folder / "profile_traces", args.top)
            print(f"\n## {mode} {variant}: kernels {total:.1f} ms in a step of {wall:.1f} ms")
            for name, ms in top:
                print(f"  {ms:8.2f} ms  {name}")


if __name__ == "__main__":
    main()
