"""The checks, as data: what each shows, what it claims (each claim a bound on figures it records: missed on a
GPU, the check fails), the function that runs it (in its own process), its timeout, its estimated duration on
a GPU, and what it needs.

They run in priority order (PRIORITY): the headline checks first (Titan side by side with TorchTitan, the
paper's Table 1, then Flash Inference at long L), then the rest as declared: the speed and prediction claims
(throughput, step time), training with every single-GPU feature, memory, then what has held on a GPU before.
Within the total budget a check whose estimate does not fit in what is left is skipped, and the next one tried."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_checks.claims import TRUE, Claim, above, at_least, at_most, below, equal_to, within

# The checks a reader of the results wants first, in order; what is not named here runs after, as declared.
PRIORITY = ("side_by_side", "table1", "hyena_flash")


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
    claims: tuple[Claim, ...] = ()
    estimate_s: int = 0  # seconds it took on a GPU (the H200 runs in gpu_results/); 0: unknown


LOSS_FALLS = Claim("loss_falls", "the loss falls: the mean of the last 3 logged losses at least 2% under the "
                   "first 3's", ("loss_falls",), TRUE)  # fmt: skip
MEMORY = (
    Claim("peak_active", "the dry run's predicted peak active memory is within 5% of "
          "torch.cuda.max_memory_allocated after the same steps", ("* peak active error",), within(0.05)),
    Claim("peak_reserved", "the dry run's predicted peak reserved memory is within 5% of "
          "torch.cuda.max_memory_reserved after the same steps", ("* peak reserved error",), within(0.05)),
)  # fmt: skip

CHECKS_DECLARED: tuple[Check, ...] = (
    Check(
        "hyena_flash",
        "Flash Inference for Hyena on CUDA (tools/bench_hyena_generation.py --paper-scale: d_model 2048 x 24 "
        "layers, L = 4k and 16k, B = 1, today's step and the step captured as CUDA graphs): mixing and end-to-end "
        "time of lazy and eager against flash (the paper: ~50x in mixing, ~1.6x end to end)",
        "gpu_checks.hyena:hyena_flash",
        240,
        claims=(
            Claim(
                "flash_mixing_at_16k",
                "Flash Inference's mixing part is at least 10x faster than lazy's at L = 16,384 (lazy's time over "
                "flash's, today's step; the paper reports ~50x)",
                ("L16384_B*_lazy_mixing_x",),
                at_least(10),
            ),
            Claim(
                "flash_end_to_end_at_16k",
                "Flash Inference generates at least 1.3x faster than lazy end to end at L = 16,384, with today's "
                "step and with CUDA graphs (the paper reports ~1.6x)",
                ("L16384_B*_lazy_e2e_x", "L16384_B*_lazy_cuda_graph_e2e_x"),
                at_least(1.3),
            ),
            Claim(
                "flash_never_slower",
                "Flash Inference is never slower than lazy or eager at any measured length "
                "(their time over flash's; 5% left for timing noise)",
                ("L*_B*_*_x",),
                at_least(0.95),
            ),
        ),
        estimate_s=150,
    ),
    Check(
        "throughput_1b",
        "tokens/s and MFU of the 1B model: bf16 eager, compiled, compiled + Float8 (the paper's Table 1 "
        "order); compiled and compiled + Float8 again at Llama 3.1 8B's width (4 layers), where the matmuls are "
        "the paper's size; the default chunked loss against the plain loss, compiled (tokens/s and peak ratios)",
        "gpu_checks.training:throughput_1b",
        240,
        float8="the Float8 variants need sm90 (H100+) and are skipped below",
        claims=(
            Claim(
                "compiled_faster",
                "compiled is faster than eager (1B, bf16, selective AC; tokens/s ratio)",
                ("compiled_vs_eager",),
                above(1),
            ),
            Claim(
                "float8_faster_at_8b_width",
                "compiled + Float8 is faster than compiled bf16 where the matmuls "
                "are as large as the paper's (8B width; Table 1: +28% at 8B; tokens/s ratio)",
                ("compiled_float8_vs_compiled_8b_width",),
                above(1),
            ),
        ),
        estimate_s=160,
    ),
    Check(
        "step_time",
        "the dry run's predicted step time on this GPU's row of the device table against real steps of the same "
        "config: the 1B model eager and compiled (bf16, selective AC)",
        "gpu_checks.step_time:step_time",
        120,
        claims=(
            Claim(
                "compiled_within_15pct",
                "the predicted step time of the compiled 1B model is within 15% of the real one",
                ("*compiled step seconds error",),
                within(0.15),
            ),
            Claim(
                "eager_within_25pct",
                "the predicted step time of the eager 1B model is within 25% of the real one",
                ("*eager step seconds error",),
                within(0.25),
            ),
        ),
        estimate_s=90,
    ),
    Check(
        "train_debug",
        "the debug model trains on CUDA with bf16, per-block compile, selective AC, Float8 and the chunked loss; "
        "the loss falls; tokens/s and MFU against the datasheet peak",
        "gpu_checks.training:train_debug",
        120,
        float8="real float8 matmuls on sm90+, emulated below",
        claims=(LOSS_FALLS,),
        estimate_s=50,
    ),
    Check(
        "memory_1b",
        "dry-run memory against real runs of the Llama 3.2 1B shape on one GPU: selective AC, no AC, and "
        "selective AC compiled (the dry run models compiled blocks eager)",
        "gpu_checks.memory:memory_1b",
        150,
        claims=MEMORY,
        estimate_s=70,
    ),
    Check(
        "memory_debug",
        "dry-run memory against a real run: the debug model at large batch and sequence, predicted active and "
        "reserved peak vs torch.cuda.max_memory_allocated / max_memory_reserved after the same steps",
        "gpu_checks.memory:memory_debug",
        60,
        claims=MEMORY,
        estimate_s=25,
    ),
    Check(
        "allocator_model",
        "the caching-allocator model (titan_debug.caching_allocator) against torch's allocator: reserved bytes "
        "after every call of random allocate/free sequences, default and expandable segments",
        "gpu_checks.allocator:allocator_model",
        40,
        claims=(
            Claim(
                "calls_equal",
                "the model told where cudaMalloc put each segment reserves exactly torch's bytes "
                "after every call (largest difference, bytes)",
                ("default.max_abs_diff", "expandable.max_abs_diff"),
                equal_to(0),
            ),
        ),
        estimate_s=20,
    ),
    Check(
        "moe_debug",
        "mixture of experts on CUDA: torch's grouped matmul kernel (bf16, sm90+) against a float32 per-expert loop, "
        "forward and gradients, empty experts included; the Qwen3-MoE debug recipe trains compiled in bf16, the "
        "loss falls, aux loss and expert imbalance reported every step; then with aux-loss-free balancing",
        "gpu_checks.moe:moe_debug",
        120,
        claims=(
            Claim(
                "grouped_mm_close",
                "torch's grouped kernel in bf16 is within 1e-2 of a float32 per-expert loop "
                "(relative to the largest entry), forward and both gradients",
                ("grouped_mm_*_rel_error",),
                at_most(1e-2),
            ),
            LOSS_FALLS,
            Claim(
                "aux_loss_free_balances",
                "aux-loss-free balancing lowers the expert imbalance over the run: "
                "the mean of the last 3 steps' imbalance over the first 3's",
                ("aux_loss_free_imbalance_late_vs_early",),
                below(1),
            ),
        ),
        estimate_s=80,
    ),
    Check(
        "simple_fsdp",
        "SimpleFSDP compiled on one rank runs and its losses equal FSDP2's (compiled, same weights and batches)",
        "gpu_checks.simple_fsdp:simple_fsdp",
        90,
        claims=(
            Claim(
                "losses_equal",
                "SimpleFSDP's losses equal FSDP2's (largest relative difference over 6 steps)",
                ("max_loss_rel_diff",),
                at_most(1e-4),
            ),
        ),
        estimate_s=35,
    ),
    Check(
        "side_by_side",
        "Titan against TorchTitan (0.3.0) on the same GPU, alternately: Llama 3.1 8B's width and Qwen3-30B-A3B's "
        "at 2 layers, the same batch, bf16 parameters, selective AC, per-block compile and FSDP2 on both sides; "
        "median tokens/s after warm-up and peak memory, Titan / TorchTitan (the bypasses applied to TorchTitan "
        "are in the notes)",
        "gpu_checks.side_by_side:side_by_side",
        240,
        claims=(
            Claim(
                "dense_at_least_par",
                "Titan's tokens/s is at least 0.95x TorchTitan's on the dense model (8B width; the goal is 1.0x)",
                ("titan_vs_torchtitan_tokens_dense",),
                at_least(0.95),
            ),
            Claim(
                "moe_at_least_par",
                "Titan's tokens/s is at least 0.95x TorchTitan's on the MoE model (Qwen3-30B-A3B width; the goal "
                "is 1.0x)",
                ("titan_vs_torchtitan_tokens_moe",),
                at_least(0.95),
            ),
        ),
    ),
    Check(
        "table1",
        "the TorchTitan paper's Table 1 on one GPU: Llama 3.1 8B's width with as many blocks as the dry run "
        "says fit (10% of the memory left free), local batch 2 x 8,192 tokens, selective AC, bf16: eager, "
        "+ compile, + compile + Float8, side by side (tokens/s, ratios beside the paper's, peak memory; where "
        "Float8 misses, its step's kernels profiled)",
        "gpu_checks.table1:table1",
        300,
        float8="the Float8 variant needs sm90 (H100+) and is skipped below",
        claims=(
            Claim(
                "compiled_faster_than_eager",
                "compiled is faster than eager (tokens/s ratio; the paper: 6,667 / 5,762 = 1.157x)",
                ("compiled_vs_eager",),
                above(1),
            ),
            Claim(
                "float8_faster_than_compiled",
                "compiled + Float8 is faster than compiled bf16 (tokens/s ratio; the paper: 8,532 / 6,667 = 1.280x)",
                ("compiled_float8_vs_compiled",),
                above(1),
            ),
            Claim(
                "compile_ratio_near_paper",
                "the compiled / eager ratio is within 15% of the paper's 1.157x ((ours - paper) / paper)",
                ("compile_ratio_vs_paper_error",),
                within(0.15),
            ),
            Claim(
                "float8_ratio_near_paper",
                "the Float8 / compiled ratio is within 15% of the paper's 1.280x ((ours - paper) / paper)",
                ("float8_ratio_vs_paper_error",),
                within(0.15),
            ),
        ),
        estimate_s=180,
    ),
)


def in_priority_order(checks: tuple[Check, ...]) -> tuple[Check, ...]:
    """PRIORITY's checks first, in its order; the others after them, as declared."""
    rank = {name: index for index, name in enumerate(PRIORITY)}
    return tuple(sorted(checks, key=lambda c: rank.get(c.name, len(PRIORITY))))  # sorted() is stable


CHECKS = in_priority_order(CHECKS_DECLARED)


def claim(check_name: str, claim_name: str) -> Claim:
    """A check's claim by name, for a check module that also stops on it (the bound stays in one place)."""
    (check,) = select([check_name])
    return next(c for c in check.claims if c.name == claim_name)


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
    if check.estimate_s:
        extras.append(f"about {check.estimate_s} s on a GPU")
    if check.float8:
        extras.append(f"float8: {check.float8}")
    extras.append("CPU rehearsal: yes" if check.rehearsal else "CPU rehearsal: none")
    head = f"{check.name}: {check.shows}"
    if check.not_yet:
        head += f" [{check.not_yet}]"
    claims = [f"\n    claim {c.name} ({c.bound}): {c.text}" for c in check.claims]
    return f"{head}\n    ({'; '.join(extras)})" + "".join(claims)
