"""The caching-allocator model (titan_debug.caching_allocator.CachingAllocatorModel) against torch's CUDA
caching allocator: the same random sequence of allocations, frees and cache releases goes to both, and the
reserved bytes must be equal after every call. The model is told where cudaMalloc put each new segment: the
address breaks ties between equal free blocks, and cudaMalloc's choice is the driver's, which no model can
know. A second model placing segments itself, as a dry run does, is compared too, and how far it drifts is
recorded. Run once with the default setting and once with `expandable_segments:True`, each in a fresh process
(torch reads PYTORCH_CUDA_ALLOC_CONF once):

    python -m gpu_checks.allocator OUT.json [--expandable] [--fake] [--seeds N] [--calls N]

`--fake` (the CPU rehearsal) puts a second, independent model placing segments at random addresses where the
real allocator would be: it runs the driver's logic (the sequences, the lockstep, the address feed, the
comparison), not the claim.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from gpu_checks.context import CheckFailed, Context
from titan_debug import CachingAllocatorModel

MIB = 1024**2
LIVE_CAP = 2048 * MIB  # bytes live at once, far under any GPU's memory: the model's capacity never binds
SIZE_CLASSES = (  # (weight, smallest, largest bytes): the small pool, the large pool's 20 MiB segments, big ones
    (0.5, 1, MIB),
    (0.3, MIB + 1, 10 * MIB),
    (0.2, 10 * MIB, 160 * MIB),
)
RELEASE_P = 0.01  # torch.cuda.empty_cache() now and then
SETTINGS = {"default": "", "expandable": "expandable_segments:True"}


def random_calls(seed: int, calls: int) -> list[tuple]:
    """("alloc", id, nbytes), ("free", id) and ("release",) calls; never more than LIVE_CAP bytes live."""
    rng, live, used, out = random.Random(seed), {}, 0, []
    for index in range(calls):
        if rng.random() < RELEASE_P:
            out.append(("release",))
            continue
        _, low, high = rng.choices(SIZE_CLASSES, weights=[c[0] for c in SIZE_CLASSES])[0]
        nbytes = rng.randint(low, high)
        if live and (used + nbytes > LIVE_CAP or rng.random() < 0.45):
            victim = rng.choice(sorted(live))
            used -= live.pop(victim)
            out.append(("free", victim))
        else:
            live[index], used = nbytes, used + nbytes
            out.append(("alloc", index, nbytes))
    return out


class ModelAllocator:
    """The model. As the CPU rehearsal's stand-in for torch (`shuffled`), it places each new segment at a
    random address, as unpredictable to the model under test as cudaMalloc's choice."""

    def __init__(self, capacity: int | None, expandable: bool, shuffled: bool = False):
        self.model = CachingAllocatorModel(capacity, expandable_segments=expandable)
        self.rng = random.Random(1) if shuffled else None
        self.reserved_before = 0

    def malloc(self, nbytes: int, segment_address: int | None = None):
        if self.rng is not None:
            segment_address = self.rng.randrange(1 << 20) << 30
        self.reserved_before = self.model.reserved_bytes
        return self.model.malloc(nbytes, segment_address=segment_address)

    def new_segment_address(self, block) -> int | None:
        """Where the segment the last malloc made starts (None if it made none)."""
        if block is None or self.model.reserved_bytes <= self.reserved_before:
            return None
        while block.prev is not None:
            block = block.prev
        return block.address

    def free(self, handle) -> None:
        self.model.free(handle)

    def release(self) -> None:
        self.model.release_cached_segments()

    def reserved(self) -> int:
        return self.model.reserved_bytes


class TorchAllocator:
    """The real one: a uint8 tensor of n bytes is one allocator request of n bytes."""

    def __init__(self):
        import torch

        self.torch = torch
        self.reserved_before = 0

    def malloc(self, nbytes: int):
        self.reserved_before = self.reserved()
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device="cuda")

    def new_segment_address(self, tensor) -> int | None:
        """Where cudaMalloc put the segment the last malloc made (None if it made none)."""
        if self.reserved() <= self.reserved_before:
            return None
        pointer = tensor.data_ptr()
        for segment in self.torch.cuda.memory_snapshot():
            if segment["address"] <= pointer < segment["address"] + segment["total_size"]:
                return segment["address"]
        raise RuntimeError(f"no segment in torch.cuda.memory_snapshot() holds the new tensor at {pointer:#x}")

    def free(self, handle) -> None:
        pass  # the caller holds no other reference: once this returns, the block goes back to the cache

    def release(self) -> None:
        self.torch.cuda.empty_cache()

    def reserved(self) -> int:
        return self.torch.cuda.memory_reserved()


@dataclass
class Comparison:
    sequences: int = 0
    calls: int = 0
    equal: int = 0
    max_abs_diff: int = 0
    first_difference: dict | None = None
    peak_real: int = 0
    peak_model: int = 0

    def add(self, index: int, call: tuple, observed: int, predicted: int) -> None:
        self.calls += 1
        self.equal += observed == predicted
        self.peak_real, self.peak_model = max(self.peak_real, observed), max(self.peak_model, predicted)
        self.max_abs_diff = max(self.max_abs_diff, abs(observed - predicted))
        if observed != predicted and self.first_difference is None:
            where = {"sequence": self.sequences - 1, "call": index, "what": list(call)}
            self.first_difference = {**where, "real": observed, "model": predicted}


# Two models follow the real allocator: one told where cudaMalloc put each new segment (its rules, checked
# exactly), one placing segments itself as a dry run must (what a prediction can be off by).
MODELS = ("real_addresses", "own_addresses")


def replay_both(calls: list[tuple], real, models: dict, comparisons: dict[str, Comparison]) -> None:
    """Every call to the real allocator and to each model in turn; reserved bytes compared after each. The
    model named "real_addresses" is given the address of each segment the real allocator makes. Ends with
    everything freed and the real cache released."""
    for comparison in comparisons.values():
        comparison.sequences += 1
    real_handles, model_handles = {}, {name: {} for name in models}
    for index, call in enumerate(calls):
        if call[0] == "alloc":
            real_handles[call[1]] = real.malloc(call[2])
            address = real.new_segment_address(real_handles[call[1]])
            for name, model in models.items():
                given = address if name == "real_addresses" else None
                model_handles[name][call[1]] = model.malloc(call[2], segment_address=given)
        elif call[0] == "free":
            real.free(real_handles.pop(call[1]))
            for name, model in models.items():
                model.free(model_handles[name].pop(call[1]))
        else:
            real.release()
            for model in models.values():
                model.release()
        for name, model in models.items():
            comparisons[name].add(index, call, real.reserved(), model.reserved())
    real_handles.clear()
    real.release()


def _device_capacity() -> int:
    import torch

    return torch.cuda.get_device_properties(0).total_memory


def drive(seeds: int, calls: int, expandable: bool, fake: bool) -> dict:
    """`seeds` sequences of `calls` calls each, fresh models per sequence (the real allocator is released
    between them, so it must be back at zero reserved bytes). Per model, its comparison with the real one."""
    capacity = None if fake else _device_capacity()
    comparisons = {name: Comparison() for name in MODELS}
    for seed in range(seeds):
        real = ModelAllocator(capacity, expandable, shuffled=True) if fake else TorchAllocator()
        models = {name: ModelAllocator(capacity, expandable) for name in MODELS}
        replay_both(random_calls(seed, calls), real, models, comparisons)
    common = {"seeds": seeds, "calls_per_seed": calls, "expandable_segments": expandable, "fake": fake}
    return {name: {**vars(comparison), **common} for name, comparison in comparisons.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--expandable", action="store_true")
    parser.add_argument("--fake", action="store_true", help="a second model stands for the real allocator")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000)
    opts = parser.parse_args(argv)
    opts.out.write_text(json.dumps(drive(opts.seeds, opts.calls, opts.expandable, opts.fake), indent=1))
    return 0


def allocator_model(ctx: Context) -> None:
    """The check: both settings, each in its own process. It fails at the first call where the model told
    cudaMalloc's addresses reserves other bytes than torch; the model placing segments itself (as the dry run
    does) is recorded beside it, with how often and by how much it differs."""
    differences = []
    for setting, conf in SETTINGS.items():
        out = ctx.work / f"{setting}.json"
        env = {k: v for k, v in ctx.env().items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        flags = [*(["--expandable"] if conf else []), *([] if ctx.cuda else ["--fake", "--calls", "500"])]
        ctx.run(ctx.python("-m", "gpu_checks.allocator", str(out), *flags), setting, env)
        results = json.loads(out.read_text())
        ctx.record(**{setting: results["real_addresses"], f"{setting}_own_addresses": results["own_addresses"]})
        for name, result in results.items():
            case = setting if name == "real_addresses" else f"{setting}, own addresses"
            ctx.compare(case, "peak reserved", result["peak_model"] / MIB, result["peak_real"] / MIB, "MiB")
        if results["real_addresses"]["first_difference"]:
            differences.append(f"{setting}: first at {results['real_addresses']['first_difference']}")
    if not ctx.cuda:
        ctx.note("CPU rehearsal: a second model with random segment addresses stands for torch's allocator "
                 "(the driver's logic, not the claim)")  # fmt: skip
    ctx.record(headline="; ".join(_summary(s, ctx.figures) for s in SETTINGS if s in ctx.figures))
    if differences:
        raise CheckFailed("reserved bytes differ: " + "; ".join(differences))


def _summary(setting: str, figures: dict) -> str:
    fed, own = figures[setting], figures[f"{setting}_own_addresses"]
    return (f"{setting}: {fed['equal']}/{fed['calls']} calls equal (own addresses {own['equal']}, "
            f"max diff {own['max_abs_diff'] / MIB:.0f} MiB)")  # fmt: skip


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
