"""Mixture of experts on CUDA: the grouped matmul's GPU kernel (torch._grouped_mm, bfloat16, sm90+) against
one float32 matmul per expert, forward and both gradients, with empty experts; then the Qwen3-MoE debug
recipe trains through the real entry point (bf16, per-block compile): the loss falls and every step reports
the auxiliary loss and the expert imbalance; and again with aux-loss-free balancing, whose imbalance late in the
run is set against its imbalance early on.

On the CPU rehearsal the grouped matmul is torch's CPU kernel in float32, and the recipe trains a few steps
eager in float32."""

from __future__ import annotations

import statistics

from gpu_checks import ROOT
from gpu_checks.context import CheckFailed, Context
from gpu_checks.training import BF16, COMPILE, loss_trend, steady, train

RECIPE = ROOT / "configs" / "qwen3_moe_debug.toml"
# (rows per expert, in, out): an empty expert first, last and between; sizes that keep 16-byte strides.
COUNTS = (0, 37, 0, 128, 5, 0, 300, 0)
IN_DIM, OUT_DIM = 256, 512
# bf16 inputs against a float32 reference of the same bf16 values: only the kernel's accumulation and its
# bf16 output rounding differ (relative to the largest entry).
TOLERANCE = {"bfloat16": 1e-2, "float32": 1e-5}

MOE_CUDA = ["--training.steps", "30", "--training.local_batch_size", "16", "--training.seq_len", "512", *BF16,
            *COMPILE]  # fmt: skip
AUX_LOSS_FREE = ["--moe.load_balance", "aux_loss_free"]
MOE_CPU = ["--training.steps", "12", "--training.local_batch_size", "4", "--training.seq_len", "64",
           "--lr_scheduler.warmup_steps", "2"]  # fmt: skip


def _relative(a, b) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12)).item()


def grouped_mm_exactness(ctx: Context) -> dict:
    """torch's grouped kernel (through titan::grouped_mm) against a per-expert float32 loop."""
    import torch

    from titan_models.moe.grouped_mm import grouped_mm, grouped_mm_loop, grouped_mm_supported

    device, dtype = ("cuda", torch.bfloat16) if ctx.cuda else ("cpu", torch.float32)
    generator = torch.Generator(device=device).manual_seed(0)
    rows = sum(COUNTS)
    x = torch.randn(rows, IN_DIM, device=device, dtype=dtype, generator=generator).requires_grad_()
    weight = torch.randn(len(COUNTS), IN_DIM, OUT_DIM, device=device, dtype=dtype, generator=generator)
    weight = (weight / IN_DIM**0.5).requires_grad_()
    offsets = torch.tensor(COUNTS, device=device).cumsum(0).to(torch.int32)
    grad = torch.randn(rows, OUT_DIM, device=device, dtype=dtype, generator=generator)
    if not grouped_mm_supported(x, weight):
        raise CheckFailed(f"torch._grouped_mm does not take {dtype} on {device}: the per-expert loop would run")
    out = grouped_mm(x, weight, offsets)
    out.backward(grad)
    x32, w32 = x.detach().float().requires_grad_(), weight.detach().float().requires_grad_()
    reference = grouped_mm_loop(x32, w32, offsets)
    reference.backward(grad.float())
    errors = {
        "out": _relative(out, reference),
        "grad_x": _relative(x.grad, x32.grad),
        "grad_weight": _relative(weight.grad, w32.grad),
    }
    empty = [e for e, n in enumerate(COUNTS) if n == 0]
    if weight.grad[empty].abs().max().item() != 0:
        raise CheckFailed(f"experts {empty} got no rows but a non-zero weight gradient")
    tolerance = TOLERANCE[str(dtype).removeprefix("torch.")]
    figures = {f"grouped_mm_{k}_rel_error": v for k, v in errors.items()}
    ctx.record(grouped_mm_dtype=str(dtype), grouped_mm_tolerance=tolerance, **figures)
    worst = max(errors, key=errors.get)
    if errors[worst] > tolerance:
        raise CheckFailed(f"grouped matmul {worst} differs from the per-expert loop by {errors[worst]:.2e} (relative)")
    return errors


def moe_debug(ctx: Context) -> None:
    errors = grouped_mm_exactness(ctx)
    overrides = MOE_CUDA if ctx.cuda else MOE_CPU
    rows = train(ctx, "qwen3_moe_debug", overrides, recipe=RECIPE)
    first, last, falls = loss_trend(rows)
    reported = all(r.get("aux_loss") is not None and r.get("expert_imbalance") is not None for r in rows)
    tps, mfu, imbalance = steady(rows, "tps"), steady(rows, "mfu"), rows[-1].get("expert_imbalance")
    ctx.record(
        steps=len(rows), loss_first3=first, loss_last3=last, loss_falls=falls, tokens_per_s=tps, mfu=mfu,
        last_expert_imbalance=imbalance, last_aux_loss=rows[-1].get("aux_loss"), overrides=" ".join(overrides),
        headline=f"grouped mm max rel error {max(errors.values()):.1e}; loss {first:.3f} -> {last:.3f}, "
        f"{tps:,.0f} tok/s, imbalance {imbalance}",
    )  # fmt: skip
    if not falls:
        raise CheckFailed(f"the loss did not fall: {first:.4f} -> {last:.4f}")
    if not reported:
        raise CheckFailed("a step's metrics lack aux_loss or expert_imbalance")
    aux_loss_free_imbalance(ctx, overrides)


def aux_loss_free_imbalance(ctx: Context, overrides: list[str]) -> None:
    """The same run with aux-loss-free balancing (per-expert biases nudged against the load, no loss term): the
    expert imbalance of the last steps against the first ones, which its claim wants lower."""
    rows = train(ctx, "qwen3_moe_debug_aux_loss_free", [*overrides, *AUX_LOSS_FREE], recipe=RECIPE)
    imbalance = [r["expert_imbalance"] for r in rows if r.get("expert_imbalance") is not None]
    if len(imbalance) < 6:
        raise CheckFailed(f"aux-loss-free run: {len(imbalance)} steps reported expert_imbalance; 6 are needed")
    early, late = statistics.fmean(imbalance[:3]), statistics.fmean(imbalance[-3:])
    ctx.record(aux_loss_free_imbalance_first3=early, aux_loss_free_imbalance_last3=late,
               aux_loss_free_imbalance_late_vs_early=late / early if early else None,
               headline=f"{ctx.figures['headline']}; aux-loss-free imbalance {early:.3g} -> {late:.3g}")  # fmt: skip
