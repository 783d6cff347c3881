"""Muon against AdamW: the optimizer step's time, the share of it in Newton-Schulz and in its gathers, and the
loss per token on the embedded corpus.

    python tools/bench_optimizer.py                          # step times on one process (1-2 minutes)
    python tools/bench_optimizer.py --fsdp 2                 # the same on FSDP 2 (gloo, launches itself)
    python tools/bench_optimizer.py --loss-curves --curve-steps 60 --out outputs/bench_optimizer

Step times: for each model (the debug Llama 3, dim 256 x 6 layers, and a larger one, dim 768 x 8 layers),
one forward and backward on random tokens, then the optimizer step with those gradients, --warmup untimed
and --steps timed (the median), for AdamW (titan-train's: foreach on CPU) and for Muon + AdamW as
`optimizer.name = "Muon"` builds it (the default parameter rule; AdamW for embeddings, head and norms).
- fwd+bwd: the forward and backward the optimizer step follows (the same for both optimizers).
- opt ms, x AdamW: the optimizer step, and Muon's over AdamW's; step x AdamW: the whole step
  (fwd+bwd+opt) with Muon over the same with AdamW.
- NS %: the share of Muon's optimizer step spent in Newton-Schulz (titan_parallel's `orthogonalize`);
  gather %: in the rest of `orthogonalize_whole` (on FSDP: each sharded matrix's all-gather and the slice
  of the result; nothing on one process).
The iteration runs in --ns-dtype (titan-train's default bfloat16; a CPU without native bf16 emulates it,
tens of times slower: the line says which).

Loss curves (--loss-curves): titan-train's Trainer on configs/debug_model.toml with AdamW and with
configs/debug_model_muon.toml (Muon), --curve-steps each, the same seed, data and tokens per step; the
table gives the training and held-out loss at a few token counts, the plot (titan-train plot's PNG:
loss, tokens/s, memory against the step, which is tokens / tokens-per-step) is written under --out.
On 2 CPU cores shared with anything else running, compare within one run, not across runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from titan_debug import cpu_has_native_bf16
from titan_models import get_model_spec
from titan_parallel import ParallelDims, apply_fsdp
from titan_parallel.optim import muon as muon_module
from titan_train.config import load_config, parse_argv
from titan_train.run.muon_params import split_params
from titan_train.run.optim import build_muon, build_optimizer

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"debug": {}, "larger": {"dim": 768, "n_layers": 8, "n_heads": 12}}
"""Flavor changes over llama3 "debug": the larger one has 11x the debug model's Muon (hidden-matrix) elements."""


class Timers:
    """Seconds spent in titan_parallel's Newton-Schulz and in orthogonalize_whole around it (gathers)."""

    def __init__(self):
        self.ns = self.whole = 0.0
        self._ns, self._whole = muon_module.orthogonalize, muon_module.orthogonalize_whole

    def __enter__(self) -> Timers:
        muon_module.orthogonalize = self._timed(self._ns, "ns")
        muon_module.orthogonalize_whole = self._timed(self._whole, "whole")
        return self

    def __exit__(self, *exc) -> None:
        muon_module.orthogonalize, muon_module.orthogonalize_whole = self._ns, self._whole

    def _timed(self, fn, field: str):
        def run(*args, **kwargs):
            start = time.perf_counter()
            result = fn(*args, **kwargs)
            setattr(self, field, getattr(self, field) + time.perf_counter() - start)
            return result

        return run


def build_model(name: str, fsdp_dims: ParallelDims | None) -> tuple[torch.nn.Module, int]:
    spec = get_model_spec("llama3")
    args = dataclasses.replace(spec.args_for("debug"), **MODELS[name])
    with torch.device("meta"):
        model = spec.model_cls(args)
    if fsdp_dims is not None:
        apply_fsdp(model, spec.plan(args).block_fqns, fsdp_dims.fsdp_mesh())
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device="cpu", seed=0)
    return model, args.vocab_size


def adamw_params() -> tuple[str, ...]:
    """What Muon must not take: the rule of Llama 3's plan (every model here is one)."""
    spec = get_model_spec("llama3")
    return spec.plan(spec.args_for("debug")).adamw_params


def build(optimizer: str, model: torch.nn.Module, ns_dtype: str) -> torch.optim.Optimizer:
    cfg = load_config(parse_argv(["--optimizer.name", optimizer, "--optimizer.muon_ns_dtype", ns_dtype])).optimizer
    if optimizer == "AdamW":
        return build_optimizer(list(model.parameters()), cfg, "cpu")
    muon, adamw = split_params(model, adamw_params())
    return build_muon([p for _, p in muon], [p for _, p in adamw], cfg, "cpu")


def time_model(name: str, opts: argparse.Namespace, fsdp_dims: ParallelDims | None) -> dict:
    """fwd+bwd and each optimizer's step (median seconds), and Muon's seconds in Newton-Schulz and gathers."""
    model, vocab = build_model(name, fsdp_dims)
    generator = torch.Generator().manual_seed(1000 + (dist.get_rank() if dist.is_initialized() else 0))
    batch = torch.randint(0, vocab, (opts.batch, opts.seq + 1), generator=generator)
    backward = []
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        F.cross_entropy(model(batch[:, :-1]).flatten(0, 1).float(), batch[:, 1:].flatten()).backward()
        backward.append(_slowest(time.perf_counter() - start))
    row = {"model": name, "fwd_bwd": backward[-1], "muon_elements": sum(p.numel() for _, p in split_params(
        model, adamw_params())[0])}  # fmt: skip
    for optimizer_name in ("AdamW", "Muon"):
        optimizer = build(optimizer_name, model, opts.ns_dtype)
        for _ in range(opts.warmup):
            optimizer.step()
        times, timers = [], Timers()
        with timers:
            for _ in range(opts.steps):
                start = time.perf_counter()
                optimizer.step()
                times.append(_slowest(time.perf_counter() - start))
        row[optimizer_name] = statistics.median(times)
        if optimizer_name == "Muon":
            total = sum(times)
            row["ns_share"] = _slowest(timers.ns) / total
            row["gather_share"] = _slowest(timers.whole - timers.ns) / total
    return row


def _slowest(seconds: float) -> float:
    """The slowest rank's seconds (a step ends when its last rank does); the value itself on one process."""
    if not dist.is_initialized():
        return seconds
    value = torch.tensor(seconds)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value.item()


def step_time_table(rows: list[dict], where: str, opts: argparse.Namespace) -> str:
    native = "native" if cpu_has_native_bf16() else "emulated on this CPU"
    dtype = opts.ns_dtype + (f" ({native})" if opts.ns_dtype == "bfloat16" else "")
    lines = [
        f"optimizer step, {where}: batch {opts.batch} x seq {opts.seq}, fp32 weights, Newton-Schulz in {dtype}; "
        f"median of {opts.steps} steps after {opts.warmup}",
        f"{'model':<8}{'Muon elems':>11}{'fwd+bwd ms':>11}{'AdamW ms':>10}{'Muon ms':>9}{'x AdamW':>9}"
        f"{'step x AdamW':>14}{'NS %':>7}{'gather %':>10}",
    ]
    for r in rows:
        adamw, muon = r["AdamW"], r["Muon"]
        whole = (r["fwd_bwd"] + muon) / (r["fwd_bwd"] + adamw)
        lines.append(
            f"{r['model']:<8}{r['muon_elements'] / 1e6:>10.2f}M{1e3 * r['fwd_bwd']:>11.1f}{1e3 * adamw:>10.1f}"
            f"{1e3 * muon:>9.1f}{muon / adamw:>9.2f}{whole:>14.2f}{100 * r['ns_share']:>7.1f}"
            f"{100 * r['gather_share']:>10.1f}"
        )
    return "\n".join(lines)


def step_times(opts: argparse.Namespace) -> None:
    """On one process, or (under torchrun) on FSDP over the launched ranks."""
    dims = None
    if "RANK" in os.environ:
        dist.init_process_group("gloo", timeout=timedelta(seconds=300))
        world = dist.get_world_size()
        dims = ParallelDims(dp_replicate=1, dp_shard=world, cp=1, tp=1, pp=1, world_size=world)
        dims.build_mesh("cpu")
    rows = [time_model(name, opts, dims) for name in opts.models]
    where = f"FSDP {dims.world_size} (gloo, CPU)" if dims else "one process (CPU)"
    if dims is None or dist.get_rank() == 0:
        print(step_time_table(rows, where, opts), flush=True)
    if dims is not None:
        dist.destroy_process_group()


def loss_curves(opts: argparse.Namespace) -> None:
    from titan_train.cli.plot import plot_runs, read_runs
    from titan_train.run.distributed import init_distributed
    from titan_train.run.trainer import Trainer

    out = Path(opts.out)
    runs = {"AdamW": "configs/debug_model.toml", "Muon": "configs/debug_model_muon.toml"}
    tokens_per_step = opts.curve_batch * opts.curve_seq
    for name, recipe in runs.items():
        folder = out / name
        (folder / "metrics.jsonl").unlink(missing_ok=True)
        config = load_config(parse_argv([
            "--config", str(ROOT / recipe), "--job.dump_folder", str(folder), "--training.steps",
            str(opts.curve_steps), "--training.seq_len", str(opts.curve_seq), "--training.local_batch_size",
            str(opts.curve_batch), "--metrics.log_freq", "1", "--validation.freq", str(opts.curve_steps // 4),
            "--validation.steps", "4",
        ]))  # fmt: skip
        Trainer(config, init_distributed(config)).train()
    plot = out / "loss.png"
    plot_runs([out / name for name in runs], plot)
    series = {name: read_runs(out / name)[0].rows for name in runs}
    marks = sorted({max(1, opts.curve_steps * k // 4) for k in range(1, 5)})
    print(f"loss on the embedded corpus (debug Llama 3), {tokens_per_step:,} tokens per step, one process")
    print(f"{'tokens':>9}{'step':>6}" + "".join(f"{name + ' train':>13}{name + ' held-out':>16}" for name in runs))
    for step in marks:
        cells = ""
        for name in runs:
            row = series[name].get(step, {})
            cells += f"{_number(row.get('loss')):>13}{_number(row.get('validation_loss')):>16}"
        print(f"{step * tokens_per_step:>9,}{step:>6}" + cells)
    for name in runs:
        first = series[name][min(series[name])]["loss"]
        last = [series[name][s]["loss"] for s in sorted(series[name])[-5:]]
        print(f"{name}: first loss {first:.4f}, mean of the last 5 steps {sum(last) / len(last):.4f}")
    print(f"plot: {plot}")


def _number(value) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else "-"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank for the timed gradients")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=1, help="untimed optimizer steps first (state allocation)")
    parser.add_argument("--steps", type=int, default=5, help="timed optimizer steps")
    parser.add_argument("--ns-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--fsdp", type=int, default=0, help="ranks of an FSDP run to time too (0: none)")
    parser.add_argument("--skip-step-times", action="store_true", help="only the loss curves")
    parser.add_argument("--loss-curves", action="store_true", help="train the debug model with each optimizer")
    parser.add_argument("--curve-steps", type=int, default=60)
    parser.add_argument("--curve-seq", type=int, default=128)
    parser.add_argument("--curve-batch", type=int, default=8)
    parser.add_argument("--out", default="outputs/bench_optimizer", help="folder of the runs and loss.png")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    opts = parse(argv)
    if "RANK" in os.environ:
        step_times(opts)
        return
    if not opts.skip_step_times:
        step_times(opts)
    if opts.fsdp > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(opts.fsdp)]
        argv = argv if argv is not None else sys.argv[1:]
        subprocess.run([*command, __file__, *argv], env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True)
    if opts.loss_curves:
        loss_curves(opts)


if __name__ == "__main__":
    main()
