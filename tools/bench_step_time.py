"""The step-time model (titan_debug/step_time.py) checked on this CPU: predicted vs measured step seconds of
the debug model, per layout.

    python tools/bench_step_time.py                         # 1 process, FSDP 2, TP 2, PP 2: ~3 minutes
    python tools/bench_step_time.py --layouts fsdp2 --steps 12 --json out.json

The device row is this CPU, measured first (step_time.cpu_device): the float32 matmul rate of one thread
(peak_flops.py's probe), its copy bandwidth, and the bus bandwidth of a gloo all-gather between two
processes. Per layout, the dry run predicts the step (`dry_run(..., gpu=that row)`: the same trace and model
as for a GPU, with one stream, as gloo on a CPU runs one thing at a time), then `torchrun` trains the same
config for --steps steps with OMP_NUM_THREADS=1 and the measured step is the median over the steps after
--warmup of the local tokens over the step's tokens/s (metrics.jsonl). The ratio predicted/measured is
printed per layout, with the tolerance `--tolerance` (exit 1 outside it).

What the CPU run has that the model leaves out: Python's and the dispatcher's time per op (tens of
microseconds, thousands of ops a step), and two ranks sharing two cores' memory bandwidth (the probe runs
alone).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "debug_model.toml"
LAYOUTS = {
    "one_process": (1, []),
    "fsdp2": (2, ["--parallelism.data_parallel_shard_degree", "2"]),
    "tp2": (2, ["--parallelism.data_parallel_shard_degree", "1", "--parallelism.tensor_parallel_degree", "2"]),
    "pp2": (2, ["--parallelism.data_parallel_shard_degree", "1", "--parallelism.pipeline_parallel_degree", "2"]),
}
COMMON = ["--validation.enable", "false", "--checkpoint.enable", "false", "--metrics.log_freq", "1"]


def _gloo_rank(rank: int, port: int, nbytes: int, out) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    shard = torch.ones(nbytes // 8, dtype=torch.float32)
    full = torch.empty(nbytes // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(6):
        dist.barrier()
        start = time.perf_counter()
        dist.all_gather_into_tensor(full, shard)
        best = min(best, time.perf_counter() - start)
    if rank == 0:
        out.put(best)
    dist.destroy_process_group()


def gloo_bus_bandwidth(nbytes: int = 32 * 2**20) -> float:
    """Bytes/s of a 2-rank gloo all-gather of `nbytes` on this machine, as NCCL's bus bandwidth counts it."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    port = 29000 + os.getpid() % 1000
    ranks = [context.Process(target=_gloo_rank, args=(r, port, nbytes, out)) for r in range(2)]
    for p in ranks:
        p.start()
    best = out.get(timeout=120)
    for p in ranks:
        p.join(timeout=60)
    return 0.5 * nbytes / best


def predicted_seconds(layout: str, extra: list[str], device, folder: Path) -> float:
    from titan_train.config import load_config, parse_argv
    from titan_train.simulate.dry_run import dry_run

    world, args = LAYOUTS[layout]
    config = load_config(
        parse_argv(["--config", str(CONFIG), *COMMON, *args, *extra, "--job.dump_folder", str(folder)])
    )
    report = dry_run(config, world, gpu=device)
    return report["step_time"]["step_seconds"]


def measured_seconds(layout: str, extra: list[str], steps: int, warmup: int, folder: Path) -> float:
    world, args = LAYOUTS[layout]
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world),
        "-m", "titan_train", "--config", str(CONFIG), *COMMON, *args, *extra,
        "--training.steps", str(steps), "--job.dump_folder", str(folder),
    ]  # fmt: skip
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL)
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    config_tokens = _local_tokens(layout, extra)
    seconds = [config_tokens / r["tps"] for r in records if r.get("step", 0) > warmup and r.get("tps")]
    return statistics.median(seconds)


def _local_tokens(layout: str, extra: list[str]) -> float:
    from titan_train.config import load_config, parse_argv
    from titan_train.config.parallel_layout import resolve_layout, tokens_per_step

    world, args = LAYOUTS[layout]
    config = load_config(parse_argv(["--config", str(CONFIG), *args, *extra]))
    return tokens_per_step(config, resolve_layout(config, world)) / world


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the measurement")
    parser.add_argument("--tolerance", type=float, default=0.35, help="allowed |predicted/measured - 1|")
    parser.add_argument("--json", type=Path, help="write the rows here")
    # Anything else is a config override for both runs, e.g. --training.seq_len 128.
    args, extra = parser.parse_known_args(argv)

    from titan_debug import LINK_EFFICIENCY, MATMUL_EFFICIENCY, MEMORY_EFFICIENCY, cpu_device

    torch.set_num_threads(1)
    device = cpu_device(gloo_bus_bandwidth())
    print(
        f"# {device.name}: matmul {device.fp32_flops * MATMUL_EFFICIENCY / 1e9:.1f} GFLOP/s, copy "
        f"{device.memory_bandwidth * MEMORY_EFFICIENCY / 1e9:.1f} GB/s, gloo "
        f"{device.intra_node_bandwidth * LINK_EFFICIENCY / 1e9:.2f} GB/s (measured)"
    )
    rows, failed = [], False
    with tempfile.TemporaryDirectory() as tmp:
        for layout in args.layouts:
            predicted = predicted_seconds(layout, extra, device, Path(tmp) / f"{layout}-dry")
            measured = measured_seconds(layout, extra, args.steps, args.warmup, Path(tmp) / f"{layout}-run")
            ratio = predicted / measured
            within = abs(ratio - 1) <= args.tolerance
            failed |= not within
            rows.append({"layout": layout, "predicted_s": predicted, "measured_s": measured, "ratio": ratio})
            print(f"{layout:>12}  predicted {predicted:7.3f} s  measured {measured:7.3f} s  ratio {ratio:5.2f}"
                  f"  {'ok' if within else 'OUTSIDE'} ±{args.tolerance:.0%}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"device": device.name, "rows": rows}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
