"""SimpleFSDP compiled on one rank against FSDP2 compiled: the same seeded weights and batches, so the losses
must agree. titan-train on one process applies no data parallelism at all, so this builds the two models
itself on a one-rank mesh (as tools/bench_simple_fsdp.py builds them on two): NCCL and inductor on CUDA,
gloo and aot_eager (which traces the collectives without generating code) in the CPU rehearsal."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gpu_checks.checks import claim
from gpu_checks.context import CheckFailed, Context

# float32; the two compiled graphs may order reductions differently. The bound is the check's claim's.
LOSS_RTOL = claim("simple_fsdp", "losses_equal").bound.high
STEPS, WARMUP = 6, 2
SIZES = {True: ("debug", 8, 512), False: ("tiny", 4, 64)}  # cuda -> (flavor, batch, seq)


def build(variant: str, mesh, flavor: str, seq: int, device: torch.device, backend: str):
    from titan_models import get_model_spec
    from titan_parallel import apply_compile, apply_fsdp, apply_simple_fsdp, sharded_params

    torch._dynamo.reset()
    spec = get_model_spec("llama3")
    args = spec.args_for(flavor)
    args.max_seq_len = seq
    with torch.device("meta"):
        model = spec.model_cls(args)
    blocks = spec.plan(args).block_fqns
    apply_compile(model, blocks, backend=backend)
    if variant == "simple_fsdp":
        apply_simple_fsdp(model, mesh, "fully_shard", block_fqns=blocks)
    else:
        apply_fsdp(model, blocks, mesh)
    model.to_empty(device=device)
    with torch.no_grad(), sharded_params():
        model.init_weights(buffer_device=device, seed=0)
    return model, args.vocab_size


def train(model, vocab: int, batch: int, seq: int, device: torch.device) -> tuple[list[float], float]:
    """Losses of STEPS AdamW steps on seeded batches, and the seconds per step after WARMUP."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    losses, start = [], 0.0
    for step in range(STEPS):
        if step == WARMUP:
            start = time.perf_counter()
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=generator).to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, (time.perf_counter() - start) / (STEPS - WARMUP)


def simple_fsdp(ctx: Context) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    device = torch.device("cuda", 0) if ctx.cuda else torch.device("cpu")
    backend = "inductor" if ctx.cuda else "aot_eager"
    flavor, batch, seq = SIZES[ctx.cuda]
    if ctx.cuda:
        torch.cuda.set_device(device)
    store = dist.FileStore(str(ctx.work / "store"), 1)
    dist.init_process_group("nccl" if ctx.cuda else "gloo", store=store, rank=0, world_size=1)
    try:
        mesh = init_device_mesh(device.type, (1,), mesh_dim_names=("dp_shard",))
        losses = {}
        for variant in ("fsdp2", "simple_fsdp"):
            model, vocab = build(variant, mesh, flavor, seq, device, backend)
            losses[variant], seconds = train(model, vocab, batch, seq, device)
            ctx.record(**{f"losses_{variant}": losses[variant], f"ms_per_step_{variant}": 1e3 * seconds})
            del model
    finally:
        dist.destroy_process_group()
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses["simple_fsdp"], losses["fsdp2"], strict=True))
    ctx.record(flavor=flavor, compile_backend=backend, max_loss_rel_diff=worst,
               headline=f"{flavor}, {backend}: {STEPS} losses, largest relative difference {worst:.1e} "
               f"(tolerance {LOSS_RTOL:g})")  # fmt: skip
    if worst > LOSS_RTOL:
        raise CheckFailed(f"SimpleFSDP's losses differ from FSDP2's by up to {worst:.2e} (relative)")
