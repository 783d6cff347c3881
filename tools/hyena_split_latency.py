"""Per-token latency of flash generation with its largest tiles split (titan_models.generate.tile_split) and
without, for tools/bench_hyena_generation.py --split-latency: both decoders generate greedily in lockstep (one
step of each in turn, the order alternating), every step timed alone, so the two see the same machine load.

Printed per (L, B): the median, p99 and largest step time of each, the step that took longest, the longest of
the three steps around the largest tile (where the split moves work; elsewhere both run the same), and the same
tokens check. The split exists for the largest value: the step after the largest tile's last input waits for
the whole tile unsplit, for a block of half its size split.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from titan_models.generate import HyenaDecoder


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@torch.no_grad()
def split_latency(
    model,
    prompt: torch.Tensor,
    length: int,
    direct_max: int | None,
    split_min: int | None,
    clock: Callable[[], float],
    step_kind: str | None = None,
) -> dict:
    """{"on"/"off": {"median", "p99", "max", "argmax" (the position of the slowest step), "split_min"},
    "same_tokens"} for flash decoders of `length` positions, split_min None: the decoder's default."""
    rows = prompt.shape[0]
    decoders = {
        "on": HyenaDecoder(model, length, "flash", rows, direct_max, step_kind=step_kind, split_min=split_min),
        "off": HyenaDecoder(model, length, "flash", rows, direct_max, step_kind=step_kind, split_min=0),
    }
    tokens = {name: [d.prefill(prompt)[:, -1].argmax(-1)] for name, d in decoders.items()}
    times: dict[str, list[float]] = {name: [] for name in decoders}
    for n in range(length - prompt.shape[1]):
        order = list(decoders) if n % 2 == 0 else list(reversed(decoders))
        for name in order:
            start = clock()
            token = decoders[name].step(tokens[name][-1]).argmax(-1)
            times[name].append(clock() - start)
            tokens[name].append(token)
    out: dict = {"same_tokens": all(torch.equal(a, b) for a, b in zip(tokens["on"], tokens["off"], strict=True))}
    # The largest tile runs at the step of position P + U - 1 (its last input), its split parts one step either side.
    prompt_len = prompt.shape[1]
    largest = 1 << ((length - 1 - prompt_len).bit_length() - 1)
    around = range(max(largest - 2, 0), min(largest + 1, length - prompt_len))
    for name, seconds in times.items():
        slowest = max(range(len(seconds)), key=seconds.__getitem__)
        out[name] = {
            "median": statistics.median(seconds),
            "p99": percentile(seconds, 0.99),
            "max": seconds[slowest],
            "argmax": prompt_len + slowest,
            "largest_tile": max(seconds[n] for n in around),
            "split_min": decoders[name].split_min,
        }
    return out


def print_split_latency(length: int, batch: int, result: dict) -> None:
    on, off = result["on"], result["off"]
    print(
        f"  L={length} B={batch} flash per-token ms, split tiles >= {on['split_min']} vs unsplit: "
        f"median {1e3 * on['median']:.2f} vs {1e3 * off['median']:.2f}, p99 {1e3 * on['p99']:.2f} vs "
        f"{1e3 * off['p99']:.2f}, max {1e3 * on['max']:.2f} (t={on['argmax']}) vs {1e3 * off['max']:.2f} "
        f"(t={off['argmax']}); around the largest tile {1e3 * on['largest_tile']:.2f} vs "
        f"{1e3 * off['largest_tile']:.2f} ({on['largest_tile'] / off['largest_tile']:.2f}x); "
        f"same tokens: {result['same_tokens']}",
        flush=True,
    )
