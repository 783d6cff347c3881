"""Benchmark Hyena generation: the three long-convolution strategies at growing lengths.

    python tools/bench_hyena_generation.py                       # L = 1k, 4k, 16k, 64k (hours on a CPU)
    python tools/bench_hyena_generation.py --lengths 1024,4096   # what fits in minutes
    python tools/bench_hyena_generation.py --quick               # smoke run: L = 256, 512, tiny flavor

For each length L, every strategy generates greedily from the same short random prompt up to L positions
with the same (randomly initialized) model, in lockstep (one step of each in turn, so load changes on a
shared machine hit all of them alike). Timed: the position-mixing part (the long convolutions:
prefill FFTs, pending sums and pushes, `HyenaDecoder.mixing_seconds`) and end to end (prefill + every
step; the one-off setup -- filters, flash's tile spectra -- is shown apart). Printed: the times and their
ratios to flash's, all from this one run. Checked: every strategy produces the same tokens, and logits
within --atol of the first strategy's (float32).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import torch

from titan_models import get_model_spec
from titan_models.generate import STRATEGIES, HyenaDecoder


def build(flavor: str, seed: int) -> torch.nn.Module:
    spec = get_model_spec("hyena")
    with torch.device("meta"):
        model = spec.model_cls(dataclasses.replace(spec.args_for(flavor)))
    model.to_empty(device="cpu")
    model.init_weights(seed=seed)
    return model.eval()


@torch.no_grad()
def run(model, prompt: torch.Tensor, length: int, strategies: list[str], direct_max: int, clock) -> dict:
    """Greedy generation to `length` positions by every strategy in lockstep: each step runs once per
    strategy, in an order that rotates, so a change in machine load hits them all alike. Returns per
    strategy: setup / mixing / total seconds and its tokens, plus the largest logit difference from the
    first strategy's."""
    decoders, results = {}, {}
    for strategy in strategies:
        start = clock()
        decoders[strategy] = HyenaDecoder(model, length, strategy=strategy, direct_max=direct_max, clock=clock)
        results[strategy] = {"setup": clock() - start, "total": 0.0, "tokens": []}
    max_diff = 0.0
    for n in range(length - prompt.shape[1] + 1):
        logits = {}
        for k in range(len(strategies)):
            strategy = strategies[(n + k) % len(strategies)]
            r, decoder = results[strategy], decoders[strategy]
            start = clock()
            if n == 0:
                logits[strategy] = decoder.prefill(prompt)[0, -1]
            else:
                logits[strategy] = decoder.step(torch.tensor(r["tokens"][-1:]))[0]
            r["total"] += clock() - start
            r["tokens"].append(int(logits[strategy].argmax()))
        first = logits[strategies[0]]
        max_diff = max(max_diff, max(float((x - first).abs().max()) for x in logits.values()))
    for strategy, r in results.items():
        r["mixing"] = decoders[strategy].mixing_seconds
    return {"strategies": results, "max_diff": max_diff}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="1024,4096,16384,65536", help="comma-separated total lengths L")
    parser.add_argument("--flavor", default="debug", help="Hyena flavor (default debug: 4 x 256)")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated subset of lazy,eager,flash")
    parser.add_argument("--prompt-len", type=int, default=16, help="prompt tokens (prefilled by FFT)")
    parser.add_argument("--direct-max", type=int, default=8, help="largest flash tile done as a direct product")
    parser.add_argument("--atol", type=float, default=1e-5, help="largest allowed logit difference between strategies")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steady timings on a shared machine)")
    parser.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="cpu: this process's CPU time (immune to other "
        "processes; equals wall time for one thread on an idle machine); wall: elapsed time",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: L = 256, 512 with the tiny flavor")
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.lengths, opts.flavor = "256,512", "tiny"
    torch.set_num_threads(opts.threads)
    clock = time.process_time if opts.clock == "cpu" else time.perf_counter
    lengths = [int(x) for x in opts.lengths.split(",")]
    strategies = opts.strategies.split(",")
    model = build(opts.flavor, opts.seed)
    args = model.args
    channels = args.n_layers * args.n_filters * args.dim
    print(
        f"# Hyena {opts.flavor}: {args.n_layers} layers x dim {args.dim}, {channels} long-conv channels; "
        f"prompt {opts.prompt_len}; float32; {torch.get_num_threads()} thread(s), {opts.clock} time; "
        f"torch {torch.__version__}",
        flush=True,
    )
    prompt = torch.randint(0, args.vocab_size, (1, opts.prompt_len), generator=torch.Generator().manual_seed(opts.seed))
    rows, ok = [], True
    for length in lengths:
        outcome = run(model, prompt, length, strategies, opts.direct_max, clock)
        results = outcome["strategies"]
        for strategy, r in results.items():
            print(
                f"  L={length} {strategy:5s} setup {r['setup']:6.2f}s  mixing {r['mixing']:8.2f}s  "
                f"total {r['total']:8.2f}s",
                flush=True,
            )
        first = results[strategies[0]]
        same_tokens = all(r["tokens"] == first["tokens"] for r in results.values())
        ok &= same_tokens and outcome["max_diff"] <= opts.atol
        rows.append((length, results, same_tokens, outcome["max_diff"]))

    print()
    print("| L | strategy | mixing s | end-to-end s | ms/token | mixing time / flash's | end-to-end / flash's |")
    print("|---|---|---|---|---|---|---|")
    for length, results, _, _ in rows:
        flash = results.get("flash")
        for strategy, r in results.items():
            per_token = 1e3 * r["total"] / (length - opts.prompt_len + 1)
            mix_speedup = f"{r['mixing'] / flash['mixing']:.2f}x" if flash else "-"
            e2e_speedup = f"{r['total'] / flash['total']:.2f}x" if flash else "-"
            print(f"| {length} | {strategy} | {r['mixing']:.2f} | {r['total']:.2f} | {per_token:.2f} | "
                  f"{mix_speedup} | {e2e_speedup} |")  # fmt: skip
    print()
    for length, _, same_tokens, max_diff in rows:
        verdict = "ok" if same_tokens and max_diff <= opts.atol else "MISMATCH"
        print(f"L={length}: same greedy tokens: {same_tokens}; max |logits - {strategies[0]}'s| = {max_diff:.2e} "
              f"(atol {opts.atol:g}): {verdict}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
