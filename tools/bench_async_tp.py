"""Plain vs async (micro-pipelined) tensor parallel on the debug Llama 3 model: tokens/s and exposed
communication per step, both variants measured in the same run.

    python tools/bench_async_tp.py --tp 2 4                    # launches torchrun per degree, one table
    torchrun --nproc_per_node 2 tools/bench_async_tp.py        # one degree (= world size)

Each rank holds its 1/tp of every layer (TP + sequence parallel, the model's own plan); the async variant is
the same model with `apply_tp(..., async_tp="titan")`: the sequence all-gathers before wq/wk/wv and w1/w3
and the reduce-scatters after wo/w2 run in chunks overlapped with the matmuls. Timed steps alternate
between the two models (plain, async, plain, ...) so that load on a shared machine hits both alike.

- tokens/s: the batch's tokens per second of forward + backward (all ranks together: TP ranks share them).
- exposed comm ms/step: time the rank spent waiting on collectives, from a separate profiled pass: the
  profiler's `_c10d_functional::wait_tensor` (DTensor's collectives, both variants) plus `async_tp::wait`
  (the chunks' collectives); a collective that finished behind a matmul costs ~0 here. Max over ranks.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from titan_models import get_model_spec
from titan_parallel import ParallelDims, apply_tp, device_module, device_type, distributed_backend
from titan_parallel.tp.async_tp_ops import WAIT_LABEL

WAIT_EVENTS = ("_c10d_functional::wait_tensor", WAIT_LABEL)


def exposed_comm_ms(step, steps: int) -> float:
    """Mean milliseconds per step spent in collective waits (WAIT_EVENTS), from the profiler's CPU times."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    total_us = sum(e.cpu_time_total for e in prof.key_averages() if e.key in WAIT_EVENTS)
    return total_us / 1000 / steps


def bench(seq_len: int, batch: int, steps: int) -> None:
    kind = device_type()
    dist.init_process_group(distributed_backend(kind))
    tp, rank = dist.get_world_size(), dist.get_rank()
    device = torch.device(kind, int(os.environ.get("LOCAL_RANK", 0))) if kind != "cpu" else torch.device("cpu")
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=tp, pp=1, world_size=tp)
    dims.build_mesh(kind)
    spec = get_model_spec("llama3")
    args = spec.args_for("debug")
    args.max_seq_len = seq_len
    plan = spec.plan(args)
    with torch.device(device):
        reference = spec.model_cls(args)
    reference.init_weights(buffer_device=device, seed=0)
    models = {}
    for name, async_tp in (("plain", None), ("async", "titan")):
        models[name] = copy.deepcopy(reference)
        apply_tp(models[name], dims.submesh("tp"), plan.tp_plan(loss_parallel=False), async_tp=async_tp)

    data = torch.randint(0, args.vocab_size, (batch, seq_len + 1), generator=torch.Generator().manual_seed(0))
    tokens, labels = data[:, :-1].to(device), data[:, 1:].to(device)

    def step(model):
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(tokens).flatten(0, 1).float(), labels.flatten()).backward()

    def synced(model):
        step(model)
        if device.type != "cpu":
            device_module(device.type).synchronize()

    elapsed = dict.fromkeys(models, 0.0)
    for model in models.values():
        synced(model)  # warm-up
    for _ in range(steps):
        for name, model in models.items():
            dist.barrier()
            start = time.perf_counter()
            synced(model)
            dist.barrier()
            elapsed[name] += time.perf_counter() - start
    row = {"tp": tp, "rank": rank, "seq": seq_len, "batch": batch}
    for name, model in models.items():
        row[f"{name}_tokens_per_s"] = batch * seq_len * steps / elapsed[name]
        row[f"{name}_exposed_ms"] = exposed_comm_ms(lambda model=model: synced(model), steps)
    rows = [None] * tp
    dist.all_gather_object(rows, row)
    if rank == 0:
        print("ROW " + json.dumps(rows), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    # Measured and reported: skip interpreter teardown, where a rank sometimes aborts ("terminate called
    # without an active exception", after the profiled passes, torch 2.13 CPU) and fails the launch.
    sys.stdout.flush()
    os._exit(0)


def drive(tps: list[int], seq_len: int, batch: int, steps: int, threads: int) -> None:
    """One torchrun per TP degree, one table."""
    table = []
    for tp in tps:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(tp)]
        command += [__file__, "--seq", str(seq_len), "--batch", str(batch), "--steps", str(steps)]
        result = subprocess.run(command, capture_output=True, text=True, env=env)
        if result.returncode:
            sys.exit(f"tp {tp} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        line = next(line for line in result.stdout.splitlines() if line.startswith("ROW "))
        table.append(json.loads(line[4:]))
    print(f"debug Llama 3, batch {batch} x seq {seq_len}, forward + backward, {steps} timed steps per variant")
    print(f"{'tp':>3} {'plain tok/s':>12} {'async tok/s':>12} {'async/plain':>12} "
          f"{'plain exposed ms':>17} {'async exposed ms':>17}")  # fmt: skip
    for rows in table:
        first = rows[0]
        plain, fast = first["plain_tokens_per_s"], first["async_tokens_per_s"]
        exposed = {name: max(r[f"{name}_exposed_ms"] for r in rows) for name in ("plain", "async")}
        print(f"{first['tp']:>3} {plain:>12.0f} {fast:>12.0f} {fast / plain:>12.2f} "
              f"{exposed['plain']:>17.1f} {exposed['async']:>17.1f}")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tp", type=int, nargs="+", help="TP degrees to launch (omit when run under torchrun)")
    parser.add_argument("--seq", type=int, default=512, help="sequence length")
    parser.add_argument("--batch", type=int, default=2, help="sequences per step")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per rank when launching (default 1)")
    args = parser.parse_args(argv)
    if args.tp:
        drive(args.tp, args.seq, args.batch, args.steps, args.threads)
    else:
        bench(args.seq, args.batch, args.steps)


if __name__ == "__main__":
    main()
