"""Flash Inference for Hyena on CUDA: tools/bench_hyena_generation.py at the paper's scale (d_model 2048 x 24
layers), L = 4k and 16k, B = 1, each strategy with today's step ("sliced", which times the mixing part) and the
per-token step captured as CUDA graphs ("cuda_graph": one launch per token, so no mixing time of its own).

The bench prints one line per (length, batch, strategy) as it finishes; they are read as they come, so a
timeout still leaves every length done. Figures: per length and step kind, lazy's and eager's mixing and
end-to-end time over flash's (`L<L>_B<B>_<strategy>[_<kind>]_{mixing,e2e}_x`; no kind for the sliced step),
and the bench's own exactness verdict (every strategy's logits against the full forward's).
"""

from __future__ import annotations

import math
import re
import time

from gpu_checks import TOOLS
from gpu_checks.context import CheckFailed, Context

BENCH = TOOLS / "bench_hyena_generation.py"
CUDA_ARGS = ["--paper-scale", "--device", "cuda", "--lengths", "4096,16384", "--quadratic-max", "16384",
             "--batch-sizes", "1", "--clock", "wall", "--step-kinds", "sliced,cuda_graph"]  # fmt: skip
CPU_ARGS = ["--device", "cpu", "--flavor", "tiny", "--lengths", "256,512", "--quadratic-max", "512",
            "--batch-sizes", "1", "--step-kinds", "sliced,static"]  # fmt: skip
ROW = re.compile(
    r"L=(?P<L>\d+) B=(?P<B>\d+) (?P<strategy>[\w/]+)\s+setup\s+(?P<setup>[\d.]+)s prefill\s+(?P<prefill>[\d.]+)s "
    r"mixing\s+(?P<mixing>[\d.]+|nan)s end-to-end\s+(?P<e2e>[\d.]+)s"
)
VERDICT = re.compile(r"^L=(?P<L>\d+) B=(?P<B>\d+): .*: (?P<verdict>PASS|FAIL)$")
POLL_S = 2.0


def parse(text: str) -> tuple[dict, dict]:
    """{(L, B): {strategy: {mixing, e2e}}} from the per-strategy lines, {(L, B): PASS|FAIL} from the verdicts."""
    rows, verdicts = {}, {}
    for line in text.splitlines():
        if match := ROW.search(line):
            key = (int(match["L"]), int(match["B"]))
            rows.setdefault(key, {})[match["strategy"]] = {"mixing": float(match["mixing"]), "e2e": float(match["e2e"])}
        elif match := VERDICT.match(line.strip()):
            verdicts[(int(match["L"]), int(match["B"]))] = match["verdict"]
    return rows, verdicts


def ratios(rows: dict) -> dict:
    """Flat figures: L<L>_B<B>_<strategy>[_<kind>]_mixing_x (and _e2e_x), each strategy's time over flash's
    with the same step kind ("lazy/cuda_graph" against "flash/cuda_graph"; the sliced step's names carry no
    kind). A step with no mixing time of its own (a graph) gives only the end-to-end figure."""
    figures = {}
    for (length, batch), strategies in sorted(rows.items()):
        for name, r in strategies.items():
            strategy, _, kind = name.partition("/")
            flash = strategies.get(f"flash/{kind}" if kind else "flash")
            if strategy == "flash" or not flash:
                continue
            label = f"L{length}_B{batch}_{strategy}" + (f"_{kind}" if kind and kind != "sliced" else "")
            if flash["mixing"] > 0 and not math.isnan(r["mixing"]) and not math.isnan(flash["mixing"]):
                figures[f"{label}_mixing_x"] = r["mixing"] / flash["mixing"]
            if flash["e2e"] > 0:
                figures[f"{label}_e2e_x"] = r["e2e"] / flash["e2e"]
    return figures


def headline(rows: dict, verdicts: dict) -> str:
    parts = []
    for (length, batch), strategies in sorted(rows.items()):
        shown = [f"{name.split('_', 2)[2].removesuffix('_x').replace('_', ' ')} {value:.2f}x" for name, value in
                 ratios({(length, batch): strategies}).items()]  # fmt: skip
        parts.append(f"L={length} B={batch}: " + "; ".join(shown or ["flash only"]))
    exact = "exact: " + ("PASS" if verdicts and all(v == "PASS" for v in verdicts.values()) else "not yet / FAIL")
    return " | ".join([*parts, exact]) + " (vs flash)"


def hyena_flash(ctx: Context) -> None:
    argv = ctx.python(str(BENCH), *(CUDA_ARGS if ctx.cuda else CPU_ARGS))
    process = ctx.start(argv, "bench")
    log = ctx.work / "bench.log"
    while process.poll() is None:
        time.sleep(POLL_S)
        _record(ctx, log.read_text(errors="replace"))
    output = _record(ctx, log.read_text(errors="replace"))
    ctx.finish(process, "bench")
    rows, verdicts = parse(output)
    if not rows or any(v != "PASS" for v in verdicts.values()):
        raise CheckFailed(f"the bench's verdicts: {verdicts or 'none printed'}")


def _record(ctx: Context, output: str) -> str:
    rows, verdicts = parse(output)
    if rows:
        ctx.record(**ratios(rows), headline=headline(rows, verdicts),
                   verdicts={f"L{k[0]}_B{k[1]}": v for k, v in verdicts.items()})  # fmt: skip
    return output
