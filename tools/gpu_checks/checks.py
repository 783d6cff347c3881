"""The checks, as data: what each shows, the function that runs it (in its own process), its time budget and
what it needs. The order is the order they run in: within the total budget the first ones always run, so
what only a GPU can show about training (CUDA, float8, compile, memory) comes first, timings after."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    name: str
    shows: str
    target: str  # "module:function", called with a Context in the check's own process
    budget_s: int  # its timeout (the total budget may cut it shorter)
    needs: tuple[str, ...] = ("cuda",)
    rehearsal: bool = True  # a CPU equivalent exists and --rehearse-cpu runs it
    float8: str = ""  # how it uses float8: real matmuls need sm90 (H100+), emulated below
    not_yet: str = ""  # why it cannot run yet; it is listed and skipped


CHECKS: tuple[Check, ...] = (
    Check(
        "train_debug",
        "the debug model trains on CUDA with bf16, per-block compile, selective AC, Float8 and the chunked loss; "
        "the loss falls; tokens/s and MFU against the datasheet peak",
        "gpu_checks.training:train_debug",
        120,
        float8="real float8 matmuls on sm90+, emulated below",
    ),
    Check(
        "memory_debug",
        "dry-run memory against a real run: the debug model at large batch and sequence, predicted active and "
        "reserved peak vs torch.cuda.max_memory_allocated / max_memory_reserved after the same steps",
        "gpu_checks.memory:memory_debug",
        60,
    ),
    Check(
        "memory_1b",
        "dry-run memory against real runs of the Llama 3.2 1B shape on one GPU: selective AC, no AC, and "
        "selective AC compiled (the dry run models compiled blocks eager)",
        "gpu_checks.memory:memory_1b",
        150,
    ),
    Check(
        "moe_debug",
        "mixture of experts on CUDA: torch's grouped matmul kernel (bf16, sm90+) against a float32 per-expert loop, "
        "forward and gradients, empty experts included; the Qwen3-MoE debug recipe trains compiled in bf16, the "
        "loss falls, aux loss and expert imbalance reported every step",
        "gpu_checks.moe:moe_debug",
        90,
    ),
    Check(
        "allocator_model",
        "the caching-allocator model (titan_debug.caching_allocator) against torch's allocator: reserved bytes "
        "after every call of random allocate/free sequences, default and expandable segments",
        "gpu_checks.allocator:allocator_model",
        40,
    ),
    Check(
        "throughput_1b",
        "tokens/s and MFU of the 1B model: bf16 eager, compiled, compiled + Float8 (the paper's Table 1 "
        "direction: each should be faster than the one before); the default chunked loss against the plain "
        "loss, compiled (tokens/s and peak ratios)",
        "gpu_checks.training:throughput_1b",
        180,
        float8="the Float8 variant needs sm90 (H100+) and is skipped below",
    ),
    Check(
        "hyena_flash",
        "Flash Inference for Hyena on CUDA (tools/bench_hyena_generation.py): mixing and end-to-end time of "
        "lazy and eager against flash (the paper: ~50x in mixing, ~1.6x end to end, at longer lengths)",
        "gpu_checks.hyena:hyena_flash",
        90,
    ),
    Check(
        "simple_fsdp",
        "SimpleFSDP compiled on one rank runs and its losses equal FSDP2's (compiled, same weights and batches)",
        "gpu_checks.simple_fsdp:simple_fsdp",
        90,
    ),
    Check(
        "step_time",
        "the dry run's predicted step time on this GPU's row of the device table against real steps of the same "
        "config: the 1B model eager and compiled (bf16, selective AC)",
        "gpu_checks.step_time:step_time",
        120,
    ),
)


def select(names: list[str] | None, checks: tuple[Check, ...] = CHECKS) -> tuple[Check, ...]:
    """The checks named (in the list's order), or all; an unknown name is a ValueError naming the known ones."""
    if not names:
        return checks
    known = {c.name: c for c in checks}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(unknown)}; the checks are: {', '.join(known)}")
    return tuple(c for c in checks if c.name in names)


def describe(check: Check) -> str:
    needs = ", ".join(check.needs) or "nothing"
    extras = [f"needs {needs}", f"budget {check.budget_s} s"]
    if check.float8:
        extras.append(f"float8: {check.float8}")
    extras.append("CPU rehearsal: yes" if check.rehearsal else "CPU rehearsal: none")
    head = f"{check.name}: {check.shows}"
    if check.not_yet:
        head += f" [{check.not_yet}]"
    return f"{head}\n    ({'; '.join(extras)})"
