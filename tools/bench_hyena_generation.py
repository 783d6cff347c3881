"""Benchmark Hyena generation: the three long-convolution strategies at growing lengths and batch sizes.

    python tools/bench_hyena_generation.py                         # docs/hyena-generation.md's table (~25 min)
    python tools/bench_hyena_generation.py --device cuda --quadratic-max 65536 --batched-max 65536 --clock wall
    python tools/bench_hyena_generation.py --quick                 # smoke run: tiny flavor, L = 256, 512

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

MiB = 2**20


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


def build(flavor: str, seed: int, device: torch.device) -> torch.nn.Module:
    spec = get_model_spec("hyena")
    with torch.device("meta"):
        model = spec.model_cls(spec.args_for(flavor))
    model.to_empty(device=device)
    model.init_weights(seed=seed)
    return model.eval()


@torch.no_grad()
def warm_up(model, prompt: torch.Tensor, length: int, strategies: list[str], direct_max: int) -> None:
    """Run every code path of a length-L decoder once: prefill (its FFT sizes), steps, every flash tile size."""
    for strategy in strategies:
        decoder = HyenaDecoder(model, length, strategy, prompt.shape[0], direct_max)
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
def run(model, prompt: torch.Tensor, length: int, strategies: list[str], direct_max: int, clock) -> dict:
    """Greedy generation to `length` positions by every strategy in lockstep; per strategy: times, memory,
    tokens [B, n] and logits [B, n, V] (n = length - P + 1: after the prompt and after each new token)."""
    rows, prompt_len = prompt.shape
    n = length - prompt_len + 1
    vocab = model.args.vocab_size
    decoders, results = {}, {}
    for strategy in strategies:
        start = clock()
        decoders[strategy] = HyenaDecoder(model, length, strategy, rows, direct_max, clock=clock)
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
        r["mixing"] = decoders[strategy].mixing_seconds
        r["end_to_end"] = r["setup"] + r["prefill"] + r["steps"]
        r["state"] = decoders[strategy].state_bytes()
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--lengths", default="1024,4096,16384,65536", help="comma-separated total lengths L")
    parser.add_argument("--quadratic-max", type=int, default=16384, help="lazy and eager run only at L <= this")
    parser.add_argument("--batch-sizes", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--batched-max", type=int, default=4096, help="batch sizes > 1 run only at L <= this")
    parser.add_argument("--flavor", default="debug_long", help="Hyena flavor (default: debug, filters long to 64k)")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated subset of lazy,eager,flash")
    parser.add_argument("--prompt-len", type=int, default=16, help="prompt tokens (prefilled by FFT)")
    parser.add_argument("--direct-max", type=int, default=8, help="largest flash tile done as a direct product")
    parser.add_argument("--atol", type=float, default=1e-4, help="largest allowed |logits - full forward's|")
    parser.add_argument("--threads", type=int, default=1, help="CPU torch threads (1: steady timings when shared)")
    parser.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default=None,
        help="cpu: this process's CPU time (default on CPU: steadier on a shared machine, equal to wall time for "
        "one thread on an idle one); wall: elapsed time (default, and the only choice, on CUDA)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny flavor, L = 256, 512, B = 1, 2")
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.lengths, opts.flavor, opts.batch_sizes, opts.batched_max = "256,512", "tiny", "1,2", 512
    device = torch.device(opts.device)
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
    strategies = opts.strategies.split(",")
    model = build(opts.flavor, opts.seed, device)
    args = model.args
    channels = args.n_layers * args.n_filters * args.dim
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} thread(s)"
    print(
        f"# Hyena {opts.flavor}: {args.n_layers} layers x dim {args.dim}, {channels} long-conv channels, "
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
            running = [s for s in strategies if s == "flash" or length <= opts.quadratic_max]
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

    print()
    print("| B | L | strategy | setup s | prefill s | mixing s | end-to-end s | ms/token | mixing ÷ flash "
          "| end-to-end ÷ flash | state MiB | peak MiB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for length, batch, outcome, _ in rows:
        results = outcome["strategies"]
        flash = results.get("flash")
        for strategy, r in results.items():
            per_token = 1e3 * r["end_to_end"] / (length - opts.prompt_len)
            mix = f"{r['mixing'] / flash['mixing']:.2f}x" if flash else "-"
            e2e = f"{r['end_to_end'] / flash['end_to_end']:.2f}x" if flash else "-"
            print(f"| {batch} | {length} | {strategy} | {r['setup']:.2f} | {r['prefill']:.3f} | {r['mixing']:.2f} | "
                  f"{r['end_to_end']:.2f} | {per_token:.2f} | {mix} | {e2e} | {r['state'] / MiB:.1f} | "
                  f"{r['peak'] / MiB:.1f} |")  # fmt: skip
    print()
    for length, batch, outcome, passed in rows:
        diffs = ", ".join(f"{s} {r['vs_forward']:.1e}" for s, r in outcome["strategies"].items())
        print(f"L={length} B={batch}: same tokens across {'/'.join(outcome['strategies'])}: {outcome['same_tokens']}; "
              f"max |logits - full forward|: {diffs} (atol {opts.atol:g}): {'PASS' if passed else 'FAIL'}")  # fmt: skip
    print()
    for strategy in strategies:
        points = [(length, o["strategies"][strategy]["mixing"]) for length, b, o, _ in rows
                  if b == 1 and strategy in o["strategies"]]  # fmt: skip
        if len(points) >= 2:
            exponent = fit_exponent([p[0] for p in points], [p[1] for p in points])
            print(f"mixing time ~ L^k, B=1, {strategy}: k = {exponent:.2f} "
                  f"(fit over L = {points[0][0]}..{points[-1][0]}, {len(points)} lengths)")  # fmt: skip
    print(f"(expected: ~2 for lazy and eager, ~1 for flash; load average at the end {os.getloadavg()[0]:.1f})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
