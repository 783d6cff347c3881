"""One side of the side-by-side check in its own processes (launched by torch.distributed.run, one process per
rank): Titan's or TorchTitan's model of one shape, parallelized by its own code (AC, per-block compile, FSDP2
with bf16 parameters and fp32 reductions), trained by the same loop (seeded random tokens, cross-entropy on
the logits, AdamW), so what differs between the sides is the model and its parallelization.

    python -m torch.distributed.run --standalone --nproc-per-node N -m gpu_checks.side_by_side_driver \
        --side titan|torchtitan --model dense|moe --out OUT.json [--cpu]

Rank 0 writes OUT.json: tokens/s of every step (global: batch x seq x ranks over the step's seconds), the
median after the warm-up steps, peak memory (CUDA), the model's class and parameter count, and the bypasses
applied to TorchTitan.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

# (Titan's family, Titan's flavor, TorchTitan's flavor, n_layers, batch, seq) per model, on a GPU and on CPU.
# GPU: Llama 3.1 8B's width and Qwen3-30B-A3B's (128 experts of width 768, top 8) at 2 of their layers, so one
# H200 holds either with its AdamW state. CPU: TorchTitan's debug models, which Titan's args are set to match.
SHAPES = {
    (True, "dense"): ("llama3", "8B", "8B", 2, 2, 4096),
    (True, "moe"): ("qwen3_moe", "30B-A3B", "30B-A3B", 2, 4, 2048),
    (False, "dense"): ("llama3", "debug", "debugmodel", 2, 2, 64),
    (False, "moe"): ("qwen3_moe", "debug", "debugmodel_moe", 1, 2, 64),
}
# Titan's debug args set to TorchTitan's debug models' shapes (TorchTitan's debugmodel_moe: 64 experts of
# width 768, top 8, 16 heads of 128, every layer MoE).
CPU_ARGS = {
    "dense": {},
    "moe": {"n_heads": 16, "n_kv_heads": 8, "attention_head_dim": 128,
            "moe": {"num_experts": 64, "top_k": 8, "hidden_dim": 768, "dense_layers": ()}},
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Options:
    side: str
    model: str
    cuda: bool
    warmup: int
    steps: int
    ac: str
    compile_backend: str
    attention: str
    work: str


def titan_args(options: Options, family: str, flavor: str, n_layers: int, seq: int):
    from titan_models import get_model_spec

    spec = get_model_spec(family)
    args = spec.args_for(flavor)
    overrides = {} if options.cuda else dict(CPU_ARGS[options.model])
    if "moe" in overrides:
        overrides["moe"] = dataclasses.replace(args.moe, **overrides["moe"])
    return spec, dataclasses.replace(args, n_layers=n_layers, max_seq_len=seq, **overrides)


def build_titan(options: Options, mesh, shape, device, param_dtype: torch.dtype) -> dict:
    from titan_parallel import apply_ac, apply_compile, apply_fsdp, sharded_params

    family, flavor, _, n_layers, _, seq = shape
    spec, args = titan_args(options, family, flavor, n_layers, seq)
    with torch.device("meta"):
        model = spec.model_cls(args)
    params = sum(p.numel() for p in model.parameters())
    cls = type(model)
    blocks = spec.plan(args).block_fqns
    if options.ac != "none":
        apply_ac(model, blocks, options.ac)
    if options.compile_backend:
        apply_compile(model, blocks, backend=options.compile_backend)
    apply_fsdp(model, blocks, mesh, param_dtype=param_dtype, reduce_dtype=torch.float32)
    model.to_empty(device=device)
    with torch.no_grad(), sharded_params():
        model.init_weights(buffer_device=device, seed=0)
    model.train()
    import titan_models

    return {"model": model, "version": titan_models.__version__ if hasattr(titan_models, "__version__") else "tree",
            "model_class": f"{cls.__module__}.{cls.__qualname__}", "params": params,
            "attention": "sdpa (causal)", "forward_kwargs": {}, "bypasses": [], "vocab": args.vocab_size}  # fmt: skip


def build_torchtitan(options: Options, shape, device, world: int, param_dtype: str) -> dict:
    from gpu_checks.side_by_side_torchtitan import Request, build

    _, _, flavor, n_layers, batch, seq = shape
    request = Request(options.model, flavor, n_layers, batch, seq, world, device, param_dtype, options.ac,
                      options.compile_backend, options.attention, options.work)  # fmt: skip
    built = build(request)
    fields = {f.name: getattr(built, f.name) for f in dataclasses.fields(built)}  # asdict would deepcopy the model
    args = getattr(built.model, "config", None) or built.model.model_args  # 0.3 / 0.2
    return {**fields, "vocab": args.vocab_size}


def backward_context(side: str):
    """TorchTitan's trainer runs backward outside its SPMD type checking (its propagation through backward
    conflicts with AC); the same here where its spmd_types is installed."""
    if side == "torchtitan":
        with contextlib.suppress(ImportError):
            import spmd_types

            return spmd_types.no_typecheck()
    return contextlib.nullcontext()


def train(options: Options, built: dict, batch: int, seq: int, device, world: int) -> list[float]:
    """Tokens/s of every step (global), with the same seeded batches on both sides."""
    model, vocab = built["model"], built["vocab"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    generator = torch.Generator().manual_seed(dist.get_rank())
    rates = []
    for _ in range(options.warmup + options.steps):
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=generator).to(device)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with built.get("step_context", contextlib.nullcontext)():
            with built.get("forward_context", contextlib.nullcontext)():
                logits = model(tokens[:, :-1], **built["forward_kwargs"])
                loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
            del logits
            with backward_context(options.side):
                loss.backward()
        optimizer.step()
        loss.item()  # waits for the step (CUDA)
        rates.append(batch * seq * world / (time.perf_counter() - start))
    return rates


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", choices=("titan", "torchtitan"), required=True)
    parser.add_argument("--model", choices=("dense", "moe"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--ac", choices=("selective", "full", "none"), default="selective")
    parser.add_argument("--compile-backend", default="", help="torch.compile backend per block; '' for eager")
    parser.add_argument("--attention", default="", help="TorchTitan's attention: flex, varlen, sdpa")
    opts = parser.parse_args(argv)
    cuda = not opts.cpu
    options = Options(opts.side, opts.model, cuda, opts.warmup, opts.steps, opts.ac, opts.compile_backend,
                      opts.attention or ("varlen" if cuda else "sdpa"), str(opts.out.parent))  # fmt: skip
    from torch.distributed.device_mesh import init_device_mesh

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats()
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        shape = SHAPES[(cuda, opts.model)]
        batch, seq = shape[4], shape[5]
        dtype_name = "bfloat16" if cuda else "float32"
        if opts.side == "titan":
            mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp_shard",))
            built = build_titan(options, mesh, shape, device, getattr(torch, dtype_name))
        else:
            built = build_torchtitan(options, shape, device, world, dtype_name)
        rates = train(options, built, batch, seq, device, world)
        result = {key: value for key, value in built.items() if not key.endswith(("model", "_kwargs", "_context"))}
        result.update(
            side=opts.side, shape=dict(zip(("family", "titan_flavor", "torchtitan_flavor", "n_layers", "batch",
                                             "seq"), shape, strict=True)),
            world=world, param_dtype=dtype_name, ac=opts.ac, compile_backend=opts.compile_backend or "eager",
            tokens_per_s_steps=rates, tokens_per_s=statistics.median(rates[opts.warmup:] or rates),
            peak_allocated_gib=torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
            peak_reserved_gib=torch.cuda.max_memory_reserved(device) / 2**30 if cuda else None,
            torch=torch.__version__,
        )  # fmt: skip
        if rank == 0:
            opts.out.write_text(json.dumps(result, indent=1, default=str))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
