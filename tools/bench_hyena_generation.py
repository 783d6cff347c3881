"""Benchmark Hyena generation: the three long-convolution strategies at growing lengths and batch sizes.

    python tools/bench_hyena_generation.py                         # docs/hyena-generation.md's table (~25 min)
    python tools/bench_hyena_generation.py --device cuda --quadratic-max 65536 --batched-max 65536 --clock wall
    python tools/bench_hyena_generation.py --quick                 # smoke run: tiny flavor, L = 256, 512
    python tools/bench_hyena_generation.py --paper-scale --device cuda   # d_model 2048 x 24 layers, L 4k..64k, B 1, 8
    python tools/bench_hyena_generation.py --paper-scale           # CPU: d_model 512 x 4 layers, L 1k..4k (minutes)
    python tools/bench_hyena_generation.py --step-kinds sliced,static --strategies flash   # today's vs graph-ready step
    python tools/bench_hyena_generation.py --split-latency --lengths 1024,4096 --batch-sizes 1   # split tiles or not

For each length L and batch size B, every strategy generates greedily from the same random prompts up to L
positions with the same randomly initialized model (flavor debug_long: filters that stay long at 64k), in
lockstep (one step of each in turn, the order rotating, so load changes on a shared machine hit all of
them alike). Before each (L, B) every strategy warms up (a decoder of length L: prefill, a few steps and,
for flash, one tile of every size), so one-off kernel and FFT-plan costs are not timed. Every clock read
follows a device synchronisation (a GPU would otherwise time kernel launches).

Timed per strategy: setup (building the decoder: filters, flash's tile spectra), prefill, mixing (the long
convolutions: prefill FFTs, pending sums, pushes -- `HyenaDecoder.mixing_seconds`) and end to end (setup +
prefill + every step). Memory: `state` is the bytes the decoder keeps between steps (exact); `peak` adds the
largest transient seen in the prefill and in the steps at powers of two, where flash runs its largest tiles
(CUDA: the allocator's peak; CPU: the bytes of live tensors that the step's torch ops created, which
leaves out the kernels' internal scratch). Checked per (L, B): every strategy produces the same tokens, and
its logits are within --atol of the full-sequence forward on those tokens. Fitted: the exponent k of
mixing time ~ L^k at B = 1 per strategy (least squares on log-log), expected ~2 for lazy/eager, ~1 for flash.

Step kinds (`--step-kinds`, hyena_step.py): sliced (today's step, a host-side position), static (the graph-ready
step run eagerly) and cuda_graph (static, captured once per tile size; the CUDA default). Only a sliced step's
mixing time can be read apart from the rest (a graph is one launch); the others show end to end only.
Memory as the paper counts it (`HyenaDecoder.memory()`): the state per layer (inputs and accumulated outputs,
O(L x D)), the filters' cached spectra and the largest transient (flash's biggest tile). Last, where lazy's
per-token work turns bandwidth-bound: the bytes its history sum reads per token per layer, (B + 1) x channels x
L x 4, against each device's memory bandwidth (titan_debug's DEVICES) and a launch-bound floor (the torch ops
of one layer's step, counted here, x --launch-us).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import weakref
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from titan_models import get_model_spec
from titan_models.generate import STRATEGIES, FlashConv, HyenaDecoder
from titan_models.generate.flash_memory import flash_memory
from titan_models.generate.hyena_step import STEP_KINDS
from titan_models.hyena import HyenaArgs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hyena_split_latency import print_split_latency, split_latency  # noqa: E402 (beside this script)

MiB = 2**20
# The paper's claim lives at a real width: d_model 2048 with the depth of a ~1B model (the Hyena paper's 1.3B
# shape), filters long to 64k. On a CPU the same shape at a quarter of the width and a sixth of the depth.
PAPER_SCALE = {
    "cuda": HyenaArgs(dim=2048, n_layers=24, vocab_size=50304, filter_emb_dim=33, filter_order=64, filter_len=65536),
    # A 2k vocabulary on CPU: the LM head of 50k would be most of a CPU step and is no part of the mixing.
    "cpu": HyenaArgs(dim=512, n_layers=4, vocab_size=2048, filter_emb_dim=33, filter_order=64, filter_len=65536),
}
# lengths, batch sizes, quadratic_max, batched_max. On one 141 GiB GPU in float32 (fits() below): three decoders
# of d_model 2048 x 24 layers hold ~140 GiB at 64k, B = 1 (flash alone ~50), and ~85 GiB at 8k, B = 8.
PAPER_SETTINGS = {
    "cuda": ("4096,8192,16384,32768,65536", "1,8", 32768, 8192),
    "cpu": ("1024,2048,4096", "1,8", 4096, 2048),
}


class LiveTensorBytes(TorchDispatchMode):
    """Peak bytes of the tensors created by torch ops inside this mode that are still referenced: a storage
    counts once, from the op that made it until its last tensor is gone (checked at each op)."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[int, list[weakref.ref]]] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        self.live = {p: (n, refs) for p, (n, refs) in self.live.items() if any(r() is not None for r in refs)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            ptr = t.untyped_storage().data_ptr()
            if ptr in given and ptr not in self.live:
                continue  # written in place, or a view of a tensor made outside (the decoder's state)
            self.live.setdefault(ptr, (t.untyped_storage().nbytes(), []))[1].append(weakref.ref(t))
        self.peak = max(self.peak, sum(n for n, _ in self.live.values()))
        return out


class PeakMeter:
    """The largest transient bytes of the calls it wraps (see the module docstring for what counts)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak = 0

    def measure(self, call: Callable[[], torch.Tensor]) -> torch.Tensor:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out = call()
            torch.cuda.synchronize()
            self.peak = max(self.peak, torch.cuda.max_memory_allocated() - before)
            return out
        with LiveTensorBytes() as live:
            out = call()
        self.peak = max(self.peak, live.peak)
        return out


def build(args: HyenaArgs, seed: int, device: torch.device) -> torch.nn.Module:
    spec = get_model_spec("hyena")
    with torch.device("meta"):
        model = spec.model_cls(args)
    model.to_empty(device=device)
    model.init_weights(seed=seed)
    return model.eval()


def runner(label: str) -> tuple[str, str | None]:
    """'flash' or 'flash/static' -> (strategy, step kind or None for the decoder's default)."""
    strategy, _, kind = label.partition("/")
    return strategy, kind or None


@torch.no_grad()
def warm_up(model, prompt: torch.Tensor, length: int, strategies: list[str], direct_max: int | None) -> None:
    """Run every code path of a length-L decoder once: prefill (its FFT sizes), steps, every flash tile size."""
    for label in strategies:
        strategy, kind = runner(label)
        decoder = HyenaDecoder(model, length, strategy, prompt.shape[0], direct_max, step_kind=kind)
        token = decoder.prefill(prompt)[:, -1].argmax(-1)
        for _ in range(min(8, length - prompt.shape[1])):
            token = decoder.step(token).argmax(-1)
        if isinstance(decoder.conv, FlashConv):
            size = 1
            while size < length:
                decoder.conv.kernels(decoder.conv.x[..., :size])
                size *= 2


def is_sampled(n: int, last: int) -> bool:
    """Steps whose memory is measured: the prefill (0), powers of two (flash's largest tiles), the last."""
    return n == last or n & (n - 1) == 0


@torch.no_grad()
def run(model, prompt: torch.Tensor, length: int, strategies: list[str], direct_max: int | None, clock) -> dict:
    """Greedy generation to `length` positions by every strategy in lockstep; per strategy: times, memory,
    tokens [B, n] and logits [B, n, V] (n = length - P + 1: after the prompt and after each new token)."""
    rows, prompt_len = prompt.shape
    n = length - prompt_len + 1
    vocab = model.args.vocab_size
    decoders, results = {}, {}
    for strategy in strategies:
        start = clock()
        kind = runner(strategy)
        decoders[strategy] = HyenaDecoder(model, length, kind[0], rows, direct_max, clock=clock, step_kind=kind[1])
        results[strategy] = {
            "setup": clock() - start,
            "prefill": 0.0,
            "steps": 0.0,
            "meter": PeakMeter(prompt.device),
            "tokens": torch.zeros(rows, n, dtype=torch.long, device=prompt.device),
            "logits": torch.zeros(rows, n, vocab, device=prompt.device),
        }
    for step in range(n):
        for k in range(len(strategies)):
            strategy = strategies[(step + k) % len(strategies)]
            r, decoder = results[strategy], decoders[strategy]
            if step == 0:
                call = lambda decoder=decoder: decoder.prefill(prompt)[:, -1]  # noqa: E731
            else:
                call = lambda decoder=decoder, token=r["tokens"][:, step - 1]: decoder.step(token)  # noqa: E731
            start = clock()
            logits = r["meter"].measure(call) if is_sampled(step, n - 1) else call()
            r["prefill" if step == 0 else "steps"] += clock() - start
            r["logits"][:, step] = logits
            r["tokens"][:, step] = logits.argmax(-1)
    for strategy, r in results.items():
        decoder = decoders[strategy]
        # Only the sliced step times its mixing apart; the others' mixing is inside one step (or graph).
        r["mixing"] = decoder.mixing_seconds if decoder.step_kind == "sliced" else float("nan")
        r["end_to_end"] = r["setup"] + r["prefill"] + r["steps"]
        r["memory"] = decoder.memory()
        r["state"] = decoder.state_bytes()
        r["peak"] = r["state"] + r.pop("meter").peak
    del decoders
    # The full-sequence forward on the generated tokens: what every strategy's logits must reproduce.
    tokens = torch.cat([prompt, results[strategies[0]]["tokens"][:, :-1]], dim=1)
    expected = model(tokens)[:, prompt_len - 1 :]
    first = results[strategies[0]]["tokens"]
    same_tokens = all(torch.equal(r["tokens"], first) for r in results.values())
    for r in results.values():
        r["vs_forward"] = float((r.pop("logits") - expected).abs().max())
    return {"strategies": results, "same_tokens": same_tokens}


def fit_exponent(lengths: list[int], seconds: list[float]) -> float:
    """Least-squares slope of log(seconds) against log(L)."""
    xs, ys = [math.log(x) for x in lengths], [math.log(y) for y in seconds]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


class OpCounter(TorchDispatchMode):
    """Counts the torch operations run inside it (each one kernel launch, or more, on a GPU)."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


@torch.no_grad()
def ops_per_layer(model, device: torch.device) -> float:
    """Torch operations of one sliced lazy step per layer, at a short length (the count does not depend on L)."""
    decoder = HyenaDecoder(model, 64, "lazy", 1, step_kind="sliced")
    token = decoder.prefill(torch.zeros(1, 4, dtype=torch.long, device=device))[:, -1].argmax(-1)
    with OpCounter() as counter:
        decoder.step(token)
    return counter.ops / model.args.n_layers


def bandwidth_report(args: HyenaArgs, lengths: list[int], batch_sizes: list[int], ops: float, launches: dict) -> None:
    """Where lazy's history sum, (B + 1) x dim x n_filters x L x 4 bytes per token per layer (the inputs and the
    filter, read once), takes longer at a device's bandwidth than one layer's launches (ops x microseconds per
    launch: `launches`, eager and graph-replayed)."""
    try:
        from titan_debug import DEVICES
    except ImportError:
        print("(titan_debug is not installed: no bandwidth report)")
        return
    per_position = args.n_filters * args.dim * 4  # bytes per row per position, one layer
    floors = {kind: ops * us * 1e-6 for kind, us in launches.items()}
    floor_text = ", ".join(f"{k} {ops:.0f} ops x {us:g} us = {floors[k] * 1e6:.0f} us" for k, us in launches.items())
    print(f"lazy, bytes per token per layer at L: (B + 1) x {per_position} x L; launch floor per layer: {floor_text}")
    for batch in batch_sizes:
        cells = ", ".join(f"L={n}: {(batch + 1) * per_position * n / MiB:.1f} MiB" for n in lengths)
        print(f"  B={batch}: {cells}")
    columns = [(b, kind) for b in batch_sizes for kind in floors]
    print("| device | bandwidth TB/s | " + " | ".join(f"B={b} {k}: bandwidth-bound from L" for b, k in columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for name, spec in DEVICES.items():
        starts = [math.ceil(floors[k] * spec.memory_bandwidth / ((b + 1) * per_position)) for b, k in columns]
        print(f"| {name} | {spec.memory_bandwidth / 1e12:.1f} | " + " | ".join(f"{n:,}" for n in starts) + " |")


def fits(args: HyenaArgs, length: int, batch: int, decoders: int, device: torch.device) -> tuple[bool, float]:
    """Whether `decoders` flash-sized decoder states fit in 80% of the device's free memory; and the GiB needed."""
    needed = decoders * flash_memory(args, length, batch, 1, direct_max=8)["state"]
    if device.type == "cuda":
        free = torch.cuda.mem_get_info()[0]
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return needed <= 0.8 * free, needed / 2**30


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--lengths", default="1024,4096,16384,65536", help="comma-separated total lengths L")
    parser.add_argument("--quadratic-max", type=int, default=16384, help="lazy and eager run only at L <= this")
    parser.add_argument("--batch-sizes", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--batched-max", type=int, default=4096, help="batch sizes > 1 run only at L <= this")
    parser.add_argument("--flavor", default="debug_long", help="Hyena flavor (default: debug, filters long to 64k)")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated subset of lazy,eager,flash")
    parser.add_argument(
        "--step-kinds",
        default="",
        help=f"comma-separated subset of {','.join(STEP_KINDS)}: every strategy runs with each (default: the "
        "decoder's own, cuda_graph on CUDA and sliced elsewhere)",
    )
    parser.add_argument("--prompt-len", type=int, default=16, help="prompt tokens (prefilled by FFT)")
    parser.add_argument(
        "--direct-max", type=int, default=None, help="largest flash tile done as a direct product (default: measured)"
    )
    parser.add_argument("--atol", type=float, default=1e-4, help="largest allowed |logits - full forward's|")
    parser.add_argument("--threads", type=int, default=1, help="CPU torch threads (1: steady timings when shared)")
    parser.add_argument("--launch-us", type=float, default=5.0, help="microseconds per torch op launched eagerly")
    parser.add_argument("--graph-launch-us", type=float, default=1.0, help="microseconds per kernel of a graph replay")
    parser.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default=None,
        help="cpu: this process's CPU time (default on CPU: steadier on a shared machine, equal to wall time for "
        "one thread on an idle one); wall: elapsed time (default, and the only choice, on CUDA)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny flavor, L = 256, 512, B = 1, 2")
    parser.add_argument(
        "--paper-scale",
        action="store_true",
        help="the setting of the paper's claim: d_model 2048 x 24 layers, L 4k..64k, B 1 and 8 (on CPU: 512 x 4 "
        "layers, L 1k..4k, B 8 to 2k: a few minutes)",
    )
    parser.add_argument(
        "--split-latency",
        action="store_true",
        help="also time every flash step with the largest tiles split and not (hyena_split_latency.py): per-token "
        "median, p99 and max",
    )
    parser.add_argument("--split-min", type=int, default=None, help="with --split-latency (default: the decoder's)")
    opts = parser.parse_args(argv)
    device = torch.device(opts.device)
    if opts.quick:
        opts.lengths, opts.flavor, opts.batch_sizes, opts.batched_max = "256,512", "tiny", "1,2", 512
    if opts.paper_scale:
        opts.lengths, opts.batch_sizes, opts.quadratic_max, opts.batched_max = PAPER_SETTINGS[device.type]
        args, label = PAPER_SCALE[device.type], f"paper scale ({device.type})"
    else:
        args, label = get_model_spec("hyena").args_for(opts.flavor), opts.flavor
    clock_kind = opts.clock or ("cpu" if device.type == "cpu" else "wall")
    if device.type == "cuda" and clock_kind == "cpu":
        parser.error("--clock cpu cannot time a GPU; use --clock wall")
    torch.set_num_threads(opts.threads)
    base_clock = time.process_time if clock_kind == "cpu" else time.perf_counter
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def clock() -> float:
        sync()
        return base_clock()

    lengths = [int(x) for x in opts.lengths.split(",")]
    batch_sizes = [int(x) for x in opts.batch_sizes.split(",")]
    kinds = [k for k in opts.step_kinds.split(",") if k]
    strategies = [f"{s}/{k}" if kinds else s for s in opts.strategies.split(",") for k in kinds or [""]]
    model = build(args, opts.seed, device)
    channels = args.n_layers * args.n_filters * args.dim
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} thread(s)"
    print(
        f"# Hyena {label}: {args.n_layers} layers x dim {args.dim}, {channels} long-conv channels, "
        f"filter_len {args.filter_len}; prompt {opts.prompt_len}; float32; {name}; {clock_kind} time; "
        f"lazy/eager to L={opts.quadratic_max}, B>1 to L={opts.batched_max}; torch {torch.__version__}; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
        flush=True,
    )
    generator = torch.Generator().manual_seed(opts.seed)
    rows, ok = [], True
    for length in lengths:
        for batch in batch_sizes:
            if batch > 1 and length > opts.batched_max:
                continue
            running = [s for s in strategies if s.startswith("flash") or length <= opts.quadratic_max]
            room, needed = fits(args, length, batch, len(running), device)  # warm-up's are gone by the run
            if not room:
                print(f"  L={length} B={batch}: skipped, its decoders need ~{needed:.0f} GiB", flush=True)
                continue
            prompt = torch.randint(0, args.vocab_size, (batch, opts.prompt_len), generator=generator).to(device)
            warm_up(model, prompt, length, running, opts.direct_max)
            outcome = run(model, prompt, length, running, opts.direct_max, clock)
            for strategy, r in outcome["strategies"].items():
                print(
                    f"  L={length} B={batch} {strategy:5s} setup {r['setup']:6.2f}s prefill {r['prefill']:6.3f}s "
                    f"mixing {r['mixing']:8.2f}s end-to-end {r['end_to_end']:8.2f}s "
                    f"state {r['state'] / MiB:7.1f} MiB peak {r['peak'] / MiB:7.1f} MiB",
                    flush=True,
                )
            within = all(r["vs_forward"] <= opts.atol for r in outcome["strategies"].values())
            passed = outcome["same_tokens"] and within
            ok &= passed
            rows.append((length, batch, outcome, passed))
            if opts.split_latency:
                kind = kinds[0] if kinds else None
                split = split_latency(model, prompt, length, opts.direct_max, opts.split_min, clock, kind)
                print_split_latency(length, batch, split)
                ok &= split["same_tokens"]
    print_tables(rows, strategies, opts.prompt_len, opts.atol)
    bandwidth_report(args, lengths, batch_sizes, ops_per_layer(model, device),
                     {"eager": opts.launch_us, "graph": opts.graph_launch_us})  # fmt: skip
    return 0 if ok else 1


def print_tables(rows: list, strategies: list[str], prompt_len: int, atol: float) -> None:
    """The table of times and memory, the exactness checks, the fitted exponents."""
    reference = next((s for s in strategies if s.startswith("flash")), None)
    print()
    print("| B | L | strategy | setup s | prefill s | mixing s | end-to-end s | ms/token | mixing ÷ flash "
          "| end-to-end ÷ flash | state MiB | history/layer MiB | spectra MiB | transient MiB "
          "| peak MiB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for length, batch, outcome, _ in rows:
        results = outcome["strategies"]
        flash = results.get(reference)
        for strategy, r in results.items():
            per_token = 1e3 * r["end_to_end"] / (length - prompt_len)
            mix = f"{r['mixing'] / flash['mixing']:.2f}x" if flash and not math.isnan(r["mixing"]) else "-"
            e2e = f"{r['end_to_end'] / flash['end_to_end']:.2f}x" if flash else "-"
            memory = r["memory"]
            print(f"| {batch} | {length} | {strategy} | {r['setup']:.2f} | {r['prefill']:.3f} | {r['mixing']:.2f} | "
                  f"{r['end_to_end']:.2f} | {per_token:.2f} | {mix} | {e2e} | {r['state'] / MiB:.1f} | "
                  f"{memory['history_per_layer'] / MiB:.1f} | {memory['spectra'] / MiB:.1f} | "
                  f"{memory['transient'] / MiB:.1f} | {r['peak'] / MiB:.1f} |")  # fmt: skip
    print()
    for length, batch, outcome, passed in rows:
        diffs = ", ".join(f"{s} {r['vs_forward']:.1e}" for s, r in outcome["strategies"].items())
        print(f"L={length} B={batch}: same tokens across {'/'.join(outcome['strategies'])}: {outcome['same_tokens']}; "
              f"max |logits - full forward|: {diffs} (atol {atol:g}): {'PASS' if passed else 'FAIL'}")  # fmt: skip
    print()
    for strategy in strategies:
        points = [(length, o["strategies"][strategy]["mixing"]) for length, b, o, _ in rows
                  if b == 1 and strategy in o["strategies"]]  # fmt: skip
        points = [p for p in points if not math.isnan(p[1])]
        if len(points) >= 2:
            exponent = fit_exponent([p[0] for p in points], [p[1] for p in points])
            print(f"mixing time ~ L^k, B=1, {strategy}: k = {exponent:.2f} "
                  f"(fit over L = {points[0][0]}..{points[-1][0]}, {len(points)} lengths)")  # fmt: skip
    print(f"(expected: ~2 for lazy and eager, ~1 for flash; load average at the end {os.getloadavg()[0]:.1f})")
    print()


if __name__ == "__main__":
    sys.exit(main())
