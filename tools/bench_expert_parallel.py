"""Expert parallelism on gloo: what the token dispatch costs. Every ratio comes from timings taken in this one
run, the two sides alternated step by step so that load on a shared machine hits both alike.

    python tools/bench_expert_parallel.py                  # EP 2 and 4 (torchrun on this machine, gloo)
    python tools/bench_expert_parallel.py --worlds 2 --steps 10

1. The Qwen3-MoE debug layer (8 experts, dim 256, top 2; 8 x 256 tokens per rank), forward + backward: split
   over EP ranks (titan_parallel's apply_ep: all-to-all there and back) against every rank holding all experts
   (no communication). Also the forward dispatch + combine alone, as a share of the EP layer's step.
2. Training tokens/s of the qwen3_moe debug recipe on the same ranks with and without expert parallelism
   (titan-train, FSDP either way, the median of the steps after the first two).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "configs" / "qwen3_moe_debug.toml"


def layer_worker(steps: int) -> None:
    """Under torchrun: time the MoE layer with and without EP; rank 0 prints one JSON line."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from titan_models import get_model_spec
    from titan_models.moe import MoE
    from titan_parallel.ep import expert_parallel
    from titan_parallel.ep.expert_parallel import apply_ep

    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    args = get_model_spec("qwen3_moe").args_for("debug")

    def build(ep: bool):
        torch.manual_seed(0)
        layer = MoE(args.dim, args.moe)
        for p in layer.parameters():
            torch.nn.init.normal_(p, std=0.02)
        if ep:
            apply_ep(layer, init_device_mesh("cpu", (world,), mesh_dim_names=("ep",)), ["experts"])
        return layer

    split, whole = build(True), build(False)
    x = torch.randn(8, 256, args.dim, generator=torch.Generator().manual_seed(rank))
    dispatch_seconds = []

    def timed(fn):
        def wrapper(*a, **k):
            start = time.perf_counter()
            out = fn(*a, **k)
            dispatch_seconds[-1] += time.perf_counter() - start
            return out

        return wrapper

    # The hooks look these up in expert_parallel's namespace at each call: timed there, the layer runs as it is.
    expert_parallel.dispatch, expert_parallel.combine = timed(expert_parallel.dispatch), timed(expert_parallel.combine)

    def step(layer):
        out, _ = layer(x)
        out.square().mean().backward()

    times = {"ep": [], "local": []}
    for index in range(steps + 1):  # the first of each is a warm-up
        for name, layer in (("ep", split), ("local", whole)):
            dispatch_seconds.append(0.0)
            dist.barrier()
            start = time.perf_counter()
            step(layer)
            dist.barrier()
            if index:
                times[name].append(time.perf_counter() - start)
            else:
                dispatch_seconds.pop()
    ep_s, local_s = statistics.median(times["ep"]), statistics.median(times["local"])
    # Only EP steps add dispatch time; the local steps appended zeros.
    share = statistics.median([s for s in dispatch_seconds if s > 0]) / ep_s
    if rank == 0:
        print(json.dumps({"world": world, "ep_ms": 1e3 * ep_s, "local_ms": 1e3 * local_s,
                          "ep_over_local": ep_s / local_s, "dispatch_combine_forward_share": share}))  # fmt: skip
    dist.destroy_process_group()


def torchrun(world: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world), *args]


def run(command: list[str]) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    if result.returncode:
        sys.exit(f"failed: {' '.join(command)}\n{result.stderr[-3000:]}")
    return result.stdout


def training_tps(world: int, steps: int, ep: int, folder: Path) -> float:
    options = ["--training.steps", str(steps), "--metrics.log_freq", "1", "--validation.enable", "false",
               "--job.dump_folder", str(folder), "--parallelism.expert_parallel_degree", str(ep)]  # fmt: skip
    run(torchrun(world, "-m", "titan_train", "--config", str(RECIPE), *options))
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["tps"] for r in rows[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", default="2,4", help="comma-separated EP degrees (= processes)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--train-steps", type=int, default=8)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--layer-worker", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.layer_worker:
        return layer_worker(opts.steps)
    rows = []
    for world in map(int, opts.worlds.split(",")):
        printed = run(torchrun(world, __file__, "--layer-worker", "--steps", str(opts.steps)))
        layer = json.loads(printed.splitlines()[-1])
        with tempfile.TemporaryDirectory() as tmp:
            # Alternated: without, with, without, with; the median of each pair's side.
            tps = {0: [], 1: []}
            for repeat in range(2):
                for with_ep in (0, 1):
                    folder = Path(tmp) / f"{with_ep}-{repeat}"
                    tps[with_ep].append(training_tps(world, opts.train_steps, world if with_ep else 1, folder))
        layer.update(tps_no_ep=statistics.mean(tps[0]), tps_ep=statistics.mean(tps[1]))
        layer["tps_ep_over_no_ep"] = layer["tps_ep"] / layer["tps_no_ep"]
        rows.append(layer)
        print(
            f"EP {world}: MoE layer fwd+bwd {layer['ep_ms']:.1f} ms split vs {layer['local_ms']:.1f} ms whole "
            f"({layer['ep_over_local']:.2f}x); forward dispatch + combine "
            f"{layer['dispatch_combine_forward_share']:.0%} of the split step; training {layer['tps_ep']:,.0f} vs "
            f"{layer['tps_no_ep']:,.0f} tokens/s ({layer['tps_ep_over_no_ep']:.2f}x)",
            flush=True,
        )
    if opts.json:
        opts.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
