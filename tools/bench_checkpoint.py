"""The training stall per checkpoint save, synchronous against asynchronous, measured in one run on this
machine.

    python tools/bench_checkpoint.py                       # 24 M parameters (~290 MB per save with AdamW)
    python tools/bench_checkpoint.py --dim 2048 --layers 8 --saves 4

A stack of Linear layers trains with AdamW (float32, one process, this machine's CPU threads or CUDA) for
--saves intervals of --interval steps, saving model + optimizer with titan-checkpoint's CheckpointManager at
the end of each interval, once with checkpoint.async_mode = "disabled" and once with "async", and once with no
saves for the baseline. Per save:

- blocked: the time the training loop spends inside save() (and, async, waiting for the previous save);
- stall: the interval's wall time minus the no-save interval's: what the save costs the run, including
  the slowdown of the steps that run while the background write competes for the CPU and the disk.

The goal is an async stall of at most 10% of the synchronous save time; the last column is that ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from titan_checkpoint import CheckpointConfig, CheckpointManager, ModelState, OptimizerState


def build(dim: int, layers: int, device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(dim, dim), nn.GELU()) for _ in range(layers)]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, optimizer


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> None:
    optimizer.zero_grad(set_to_none=True)
    model(batch).pow(2).mean().backward()
    optimizer.step()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run(mode: str | None, args, device: torch.device, folder: Path) -> tuple[list[float], list[float]]:
    """(wall seconds of each interval, seconds blocked in save() per save) for one mode (None: no saves)."""
    model, optimizer = build(args.dim, args.layers, device)
    batch = torch.randn(args.batch, args.dim, device=device)
    train_step(model, optimizer, batch)  # allocate the optimizer state before timing
    manager = None
    if mode is not None:
        states = {"model": ModelState(model), "optimizer": OptimizerState(model, optimizer)}
        config = CheckpointConfig(interval=args.interval, async_mode=mode, keep_latest_k=1, save_rng=False)
        manager = CheckpointManager(folder / mode, states, config)
    intervals, blocked = [], []
    step = 1
    for _ in range(args.saves + 1):  # the first interval warms up (allocations, first save's setup)
        start = time.perf_counter()
        for _ in range(args.interval):
            step += 1
            train_step(model, optimizer, batch)
            sync(device)
            if manager is not None and step % args.interval == 0:
                before = time.perf_counter()
                manager.save(step)
                blocked.append(time.perf_counter() - before)
        intervals.append(time.perf_counter() - start)
    if manager is not None:
        manager.close()
    return intervals[1:], blocked[1:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=23)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--interval", type=int, default=10, help="training steps per save")
    parser.add_argument("--saves", type=int, default=3, help="timed saves per mode (after one warm-up)")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    params = args.layers * (args.dim * args.dim + args.dim)
    print(f"{params / 1e6:.1f} M parameters, {params * 12 / 1e6:.0f} MB per save (weights + AdamW), "
          f"{args.interval} steps per save, {args.saves} saves per mode, {device}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        baseline, _ = run(None, args, device, folder)
        modes = ("disabled", "async") + (("async_with_pinned_mem",) if device.type == "cuda" else ())
        results = {mode: run(mode, args, device, folder) for mode in modes}
    base = statistics.median(baseline)
    sync_save = statistics.median(results["disabled"][1])
    print(f"interval without saves: {base:.2f} s ({base / args.interval * 1000:.0f} ms/step)")
    print(f"{'async_mode':<22} {'blocked/save (s)':>17} {'stall/save (s)':>15} {'stall / sync save time':>23}")
    for mode, (intervals, blocked) in results.items():
        stall = max(0.0, statistics.median(intervals) - base)
        print(f"{mode:<22} {statistics.median(blocked):>17.3f} {stall:>15.3f} {stall / sync_save:>22.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
