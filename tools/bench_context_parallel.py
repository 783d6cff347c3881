"""Context-parallel throughput and per-rank memory of the debug Llama 3 model (forward + backward, batch 1).

    python tools/bench_context_parallel.py --cp 1 2 4 --seq 2048 4096        # launches torchrun per cp, one table
    torchrun --nproc_per_node 2 tools/bench_context_parallel.py --seq 2048    # one cp degree (= world size)

Each rank holds the whole model (no FSDP: parameters are not what CP divides) and its load-balanced 1/cp of
the sequence; attention is ring attention (`apply_cp` swaps the model's attention modules). Per rank it measures
- activations: bytes of the distinct tensors autograd saves for backward in one forward, parameters excluded
  (what CP divides: the paper's Table 2 is this per-rank activation memory falling as cp grows);
- peak: the allocator's peak on CUDA, or the process's peak RSS on CPU (a high-water mark over the whole
  run, so lengths run in increasing order and each row is the peak up to that length).
tokens/s counts the sequence's tokens (all ranks together) per second of forward + backward. With --cp the
driver gives each rank --threads CPU threads (default 1: a rank is one core, as it would be one GPU); on a box
with fewer cores than ranks they share cores, and tokens/s then shows overheads, not scaling.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from titan_models import get_model_spec
from titan_parallel import (
    ParallelDims,
    apply_cp,
    device_module,
    device_type,
    distributed_backend,
    load_balanced_positions,
    shard_sequence,
)

MIB = 2**20


def saved_activation_bytes(model: torch.nn.Module, run) -> int:
    """Bytes of the distinct storages autograd saves while `run()` builds the graph, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    return out, sum(seen.values())


def peak_bytes(device: torch.device) -> int:
    if device.type == "cpu":
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return device_module(device.type).max_memory_allocated(device)


def bench(seq_lens: list[int], steps: int, variant: str) -> None:
    kind = device_type()
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group(distributed_backend(kind))
    cp, rank = (dist.get_world_size(), dist.get_rank()) if distributed else (1, 0)
    device = torch.device(kind, int(os.environ.get("LOCAL_RANK", 0))) if kind != "cpu" else torch.device("cpu")
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=cp, tp=1, pp=1, world_size=cp)
    dims.build_mesh(kind)
    cp_mesh = dims.submesh("cp")

    spec = get_model_spec("llama3")
    args = spec.args_for("debug")
    args.max_seq_len = max(seq_lens)
    with torch.device(device):
        model = spec.model_cls(args)
    model.init_weights(buffer_device=device, seed=0)
    if cp_mesh is not None:
        apply_cp(model, cp_mesh, spec.plan(args).attention_fqns, variant=variant)

    for seq_len in sorted(seq_lens):
        data = torch.randint(0, args.vocab_size, (1, seq_len + 1), generator=torch.Generator().manual_seed(seq_len))
        tokens, labels = data[:, :-1].to(device), data[:, 1:].to(device)
        positions = None
        if cp_mesh is not None:
            tokens, labels = shard_sequence([tokens, labels], cp_mesh)
            positions = load_balanced_positions(seq_len, cp, rank, device)

        def run(tokens=tokens, labels=labels, positions=positions):
            logits = model(tokens, positions)
            return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())

        if device.type != "cpu":
            device_module(device.type).reset_peak_memory_stats(device)
        loss, activations = saved_activation_bytes(model, run)  # also the warm-up step
        loss.backward()
        if distributed:
            dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            model.zero_grad(set_to_none=True)
            run().backward()
        if device.type != "cpu":
            device_module(device.type).synchronize()
        if distributed:
            dist.barrier()
        elapsed = time.perf_counter() - start
        row = {"cp": cp, "seq": seq_len, "tokens_per_s": seq_len * steps / elapsed, "rank": rank}
        row |= {"activations_mib": activations / MIB, "peak_mib": peak_bytes(device) / MIB}
        rows = [None] * cp
        if distributed:
            dist.all_gather_object(rows, row)
        else:
            rows = [row]
        if rank == 0:
            for r in rows:
                print("ROW " + json.dumps(r), flush=True)
    if distributed:
        dist.destroy_process_group()


def drive(cps: list[int], seq_lens: list[int], steps: int, variant: str, threads: int) -> None:
    """Launch one torchrun per cp degree and print one table."""
    rows = []
    for cp in cps:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(cp)]
        command += [__file__, "--seq", *map(str, seq_lens), "--steps", str(steps), "--variant", variant]
        result = subprocess.run(command, capture_output=True, text=True, env=env)
        if result.returncode:
            sys.exit(f"cp {cp} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        rows += [json.loads(line[4:]) for line in result.stdout.splitlines() if line.startswith("ROW ")]
    print(f"debug Llama 3, batch 1, forward + backward, ring attention ({variant}), {steps} timed steps")
    print(f"{'seq':>6} {'cp':>3} {'tokens/s':>9} {'activations MiB/rank':>21} {'peak MiB/rank (max)':>20}")
    for seq in sorted(seq_lens):
        for cp in cps:
            mine = [r for r in rows if r["seq"] == seq and r["cp"] == cp]
            acts, peak = max(r["activations_mib"] for r in mine), max(r["peak_mib"] for r in mine)
            print(f"{seq:>6} {cp:>3} {mine[0]['tokens_per_s']:>9.0f} {acts:>21.1f} {peak:>20.0f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, nargs="+", default=[2048, 4096], help="sequence lengths")
    parser.add_argument("--cp", type=int, nargs="+", help="cp degrees to launch (omit when run under torchrun)")
    parser.add_argument("--steps", type=int, default=2, help="timed forward + backward steps per length")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per rank when launching (default 1)")
    parser.add_argument("--variant", default="p2p", choices=["p2p", "allgather"], help="ring attention variant")
    args = parser.parse_args(argv)
    if args.cp:
        drive(args.cp, args.seq, args.steps, args.variant, args.threads)
    else:
        bench(args.seq, args.steps, args.variant)


if __name__ == "__main__":
    main()
