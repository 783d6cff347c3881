"""SimpleFSDP against FSDP2, eager and compiled, on the debug Llama 3 model: training throughput and memory.

    python tools/bench_simple_fsdp.py                     # launches itself: 2 ranks, gloo, CPU, ~2-3 minutes
    python tools/bench_simple_fsdp.py --steps 10 --seq 512 --overlap none

Every variant shards the same model the same way (fully_shard over 2 ranks, fp32, AdamW), starts from the
same seeded weights and trains on the same batches, so the first-step losses agree. Per variant: --warmup
steps (which include compilation), then --steps timed steps, then one profiled step.
- tokens/s: the tokens of all ranks per second of timed steps (the slowest rank's time).
- peak MiB: the highest net CPU tensor memory allocated during the profiled step above what was live when
  it started (the profiler's allocation events, so activations, gathered parameters, gradients and
  communication buffers, not parameters or optimizer state held across steps); the larger rank's. It is
  what the process's peak RSS cannot tell apart per variant (RSS only rises, and compilation dominates it).
Compiled variants use --backend (inductor) on each block; --overlap is SimpleFSDP's bucketing/reordering
(`enable_overlap`; default "bucket_reorder", the best that runs on CPU; FSDP2's graphs have no collectives
for it to touch).
Ratios are against FSDP2 eager, measured in the same run. On 2 CPU cores the ranks share the machine with
anything else running, so compare variants within one run, not across runs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

from titan_models import get_model_spec
from titan_parallel import (
    OVERLAP_MODES,
    ParallelDims,
    apply_compile,
    apply_fsdp,
    apply_simple_fsdp,
    enable_overlap,
    sharded_params,
)

VARIANTS = ("simple_fsdp_eager", "simple_fsdp_compiled", "fsdp2_eager", "fsdp2_compiled")
MIB = 2**20


def build(variant: str, dims: ParallelDims, backend: str, seq: int) -> tuple[torch.nn.Module, int]:
    spec = get_model_spec("llama3")
    args = spec.args_for("debug")
    args.max_seq_len = seq
    with torch.device("meta"):
        model = spec.model_cls(args)
    blocks = spec.plan(args).block_fqns
    if variant.endswith("compiled"):
        apply_compile(model, blocks, backend=backend)
    if variant.startswith("simple_fsdp"):
        apply_simple_fsdp(model, dims.fsdp_mesh(), "fully_shard", block_fqns=blocks)
    else:
        apply_fsdp(model, blocks, dims.fsdp_mesh())
    model.to_empty(device="cpu")
    with torch.no_grad(), sharded_params():  # SimpleFSDP: initialize the shards, not gathered copies
        model.init_weights(buffer_device="cpu", seed=0)
    return model, args.vocab_size


def peak_step_bytes(step) -> int:
    """Net bytes allocated at the high point of `step()`, from the profiler's allocation/free events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def run_variant(variant: str, dims: ParallelDims, opts: argparse.Namespace) -> dict:
    torch._dynamo.reset()
    model, vocab = build(variant, dims, opts.backend, opts.seq)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rank, world = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(1000 + rank)
    batches = [torch.randint(0, vocab, (opts.batch, opts.seq + 1), generator=generator) for _ in range(4)]
    losses = []

    def step(i: int = 0) -> None:
        batch = batches[i % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    start = time.perf_counter()
    for i in range(opts.warmup):
        step(i)
    warmup_s = time.perf_counter() - start
    dist.barrier()
    start = time.perf_counter()
    for i in range(opts.steps):
        step(opts.warmup + i)
    elapsed = torch.tensor(time.perf_counter() - start)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    peak = torch.tensor(float(peak_step_bytes(step)))
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    first_loss = torch.tensor(losses[0])
    dist.all_reduce(first_loss, op=dist.ReduceOp.AVG)
    tokens = opts.batch * opts.seq * world * opts.steps
    return {
        "variant": variant,
        "tokens_per_s": tokens / elapsed.item(),
        "peak_mib": peak.item() / MIB,
        "warmup_s": warmup_s,
        "first_loss": first_loss.item(),
    }


def bench(opts: argparse.Namespace) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    world = dist.get_world_size()
    dims = ParallelDims(dp_replicate=1, dp_shard=world, cp=1, tp=1, pp=1, world_size=world)
    dims.build_mesh("cpu")
    if opts.overlap != "none":
        enable_overlap(opts.overlap, opts.backend, "cpu")
    rows = [run_variant(v, dims, opts) for v in opts.variants]
    if dist.get_rank() == 0:
        base = next((r for r in rows if r["variant"] == "fsdp2_eager"), rows[0])
        print(
            f"debug Llama 3, fully_shard over {world} ranks (gloo, CPU), batch "
            f"{opts.batch} x seq {opts.seq} per rank, fp32, AdamW; {opts.warmup} warmup + {opts.steps} timed "
            f"steps; compile backend {opts.backend}, SimpleFSDP overlap {opts.overlap!r}"
        )
        header = f"{'variant':<22}{'tokens/s':>10}{'x fsdp2_eager':>15}{'peak MiB':>10}{'x fsdp2_eager':>15}"
        print(header + f"{'warmup s':>10}{'loss@1':>9}")
        for r in rows:
            speed, memory = r["tokens_per_s"] / base["tokens_per_s"], r["peak_mib"] / base["peak_mib"]
            print(
                f"{r['variant']:<22}{r['tokens_per_s']:>10.0f}{speed:>15.2f}{r['peak_mib']:>10.1f}{memory:>15.2f}"
                f"{r['warmup_s']:>10.1f}{r['first_loss']:>9.4f}"
            )
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (compilation happens here)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps")
    parser.add_argument("--backend", default="inductor", choices=["inductor", "aot_eager"])
    parser.add_argument(
        "--overlap", default="bucket_reorder", choices=OVERLAP_MODES, help="SimpleFSDP's inductor bucketing"
    )
    parser.add_argument("--nproc", type=int, default=2, help="ranks to launch")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per rank")
    opts = parser.parse_args(argv)
    if "RANK" in os.environ:
        bench(opts)
        return
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(opts.nproc)]
    env = {**os.environ, "OMP_NUM_THREADS": str(opts.threads)}
    result = subprocess.run([*command, __file__, *(argv if argv is not None else sys.argv[1:])], env=env)
    sys.exit(result.returncode)


if __name__ == "__main__":
    main()
