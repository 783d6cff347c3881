"""Tokens/s the training dataloader delivers per data format, against what the trainer consumes on the debug
model, measured in one run on this machine.

    python tools/bench_dataloader.py                   # the debug recipe's shape: batch 8 x 256 tokens
    python tools/bench_dataloader.py --copies 4 --batches 2000 --steps 10

The corpus is the embedded King James Bible (1166 training chapters, 1.1 M tokens), repeated --copies times,
written as JSONL (plain, gzip, zstd), Parquet and pre-tokenized (`titan-data tokenize`). Each loader is the
trainer's (`build_dataloader`, one data-parallel rank, in-process: dataloader_num_workers = 0, shuffled by the
seed), timed over --batches batches after its first, best of two passes. The trainer's rate is the debug
Llama 3 model's optimizer steps (forward, backward, AdamW; float32, one process; on CUDA when there is a GPU,
else this machine's CPU threads) on batches of the same shape. With in-process loading each step waits for its
batch, so consumed / (consumed + delivered) is the data-time fraction the trainer would report in
metrics.jsonl (data_time_frac), printed as the last column.

The second table is what the layout-invariant order (training.data_order = "global") costs one data-parallel
rank at --dp-sizes ranks, against the document-sharded order: every rank of the global order packs the whole
stream and keeps 1/dp of it, so it tokenizes dp tokens per token it delivers, the sharded order about 1 (its
tokenizer's encode_batch calls are counted; both read ahead up to 256 documents, which adds to the count over
a short run). Rank 0's loader, raw text (jsonl) and pre-tokenized, timed over
--order-batches batches after its first.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

import torch
import torch.nn.functional as F

from titan_models import get_model_spec
from titan_train.cli.data import main as titan_data
from titan_train.config import build_config
from titan_train.config.model_args import model_args
from titan_train.data import build_dataloader, resolve_dataset
from titan_train.data.tokenizer import load_tokenizer


def write_corpus(folder: Path, copies: int) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    texts = list(resolve_dataset("kjv").documents()) * copies
    lines = "".join(json.dumps({"text": t}) + "\n" for t in texts)
    paths = {"jsonl": folder / "kjv.jsonl", "jsonl.gz": folder / "kjv.jsonl.gz", "jsonl.zst": folder / "kjv.jsonl.zst"}
    paths["jsonl"].write_text(lines)
    with gzip.open(paths["jsonl.gz"], "wt") as f:
        f.write(lines)
    paths["jsonl.zst"].write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    paths["parquet"] = folder / "kjv.parquet"
    pq.write_table(pa.table({"text": texts}), paths["parquet"], row_group_size=1024)
    paths["pre-tokenized"] = folder / "kjv_tokens"
    with contextlib.redirect_stdout(io.StringIO()):
        written = titan_data(["tokenize", str(paths["jsonl"]), str(paths["pre-tokenized"])])
    if written != 0:
        sys.exit("titan-data tokenize failed")
    return paths


class CountingTokenizer:
    """The trainer's tokenizer, counting the tokens its encode_batch calls produce."""

    def __init__(self, tokenizer):
        self.inner, self.encoded = tokenizer, 0
        self.bos_id, self.eos_id = tokenizer.bos_id, tokenizer.eos_id

    def encode_batch(self, texts):
        out = self.inner.encode_batch(texts)
        self.encoded += sum(map(len, out))
        return out


def loader_tokens_per_second(
    path: Path, tokenizer, batch: int, seq_len: int, batches: int, dp: int = 1, order: str = "global"
) -> float:
    loader = build_dataloader("text", str(path), tokenizer, seq_len=seq_len, local_batch_size=batch, seed=42,
                              dp_rank=0, dp_world_size=dp, data_order=order)  # fmt: skip
    it = iter(loader)
    next(it)  # the first batch pays for opening files and the first chunk; a run pays it once
    start = time.perf_counter()
    for _ in islice(it, batches):
        pass
    return batches * batch * seq_len / (time.perf_counter() - start)


def order_cost(path: Path, tokenizer, batch: int, seq_len: int, batches: int, dp: int, order: str):
    """(rank 0's delivered tokens/s, tokens it tokenized per token it delivered), best of two passes."""
    counting = CountingTokenizer(tokenizer)
    rate = max(loader_tokens_per_second(path, counting, batch, seq_len, batches, dp, order) for _ in "ab")
    return rate, counting.encoded / 2 / ((batches + 1) * batch * seq_len)


def trainer_tokens_per_second(vocab_size: int, batch: int, seq_len: int, steps: int) -> float:
    config = build_config({}, {"model.flavor": "debug", "training.seq_len": str(seq_len)}, source="bench")
    spec, args = get_model_spec("llama3"), model_args(config)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = spec.model_cls(args).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=8e-4)
    tokens = torch.randint(0, vocab_size, (batch, seq_len + 1), device=device)

    def step():
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up: allocations, first-call dispatch
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return steps * batch * seq_len / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=2, help="times the embedded corpus is repeated")
    parser.add_argument("--batches", type=int, default=1000, help="batches timed per loader")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps timed for the trainer")
    parser.add_argument("--batch", type=int, default=8, help="training.local_batch_size")
    parser.add_argument("--seq-len", type=int, default=256, help="training.seq_len")
    parser.add_argument("--dp-sizes", type=int, nargs="+", default=[1, 2, 4, 8], help="data-parallel sizes")
    parser.add_argument("--order-batches", type=int, default=100, help="batches timed per data-order point")
    args = parser.parse_args()
    tokenizer = load_tokenizer(None)
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_corpus(Path(tmp), args.copies)
        # Best of two: the first pass over a format also warms the tokenizer's thread pool and the page cache.
        delivered = {
            name: max(loader_tokens_per_second(path, tokenizer, args.batch, args.seq_len, args.batches) for _ in "ab")
            for name, path in paths.items()
        }
        orders = {
            (name, dp, order): order_cost(
                paths[name], tokenizer, args.batch, args.seq_len, args.order_batches, dp, order
            )
            for name in ("jsonl", "pre-tokenized")
            for dp in args.dp_sizes
            for order in ("global", "document_sharded")
        }
    consumed = trainer_tokens_per_second(tokenizer.vocab_size, args.batch, args.seq_len, args.steps)
    where = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads"
    print(f"batch {args.batch} x {args.seq_len} tokens, one process; trainer on {where}")
    print(f"trainer (debug model, fwd+bwd+AdamW) consumes {consumed:>12,.0f} tokens/s")
    print(f"{'format':<14} {'delivered tokens/s':>19} {'x trainer':>10} {'data-time fraction':>19}")
    reference = delivered["jsonl"]
    for name, rate in delivered.items():
        print(f"{name:<14} {rate:>19,.0f} {rate / consumed:>10.1f} {consumed / (consumed + rate):>19.2%}")
    print(f"pre-tokenized / jsonl: {delivered['pre-tokenized'] / reference:.1f}x, "
          f"parquet / jsonl: {delivered['parquet'] / reference:.2f}x")  # fmt: skip
    print("\none data-parallel rank: data_order 'global' against 'document_sharded'")
    print(f"{'format':<14} {'dp':>3} {'tokenized/delivered':>20} {'(sharded)':>10} {'work ratio':>11} "
          f"{'delivered tokens/s':>19} {'(sharded)':>12} {'rate ratio':>11}")  # fmt: skip
    for name in ("jsonl", "pre-tokenized"):
        for dp in args.dp_sizes:
            (rate, work), (sharded_rate, sharded_work) = (orders[name, dp, o] for o in ("global", "document_sharded"))
            ratio = f"{work / sharded_work:>10.1f}x" if sharded_work else f"{'-':>11}"
            print(f"{name:<14} {dp:>3} {work:>20.2f} {sharded_work:>10.2f} {ratio} "
                  f"{rate:>19,.0f} {sharded_rate:>12,.0f} {rate / sharded_rate:>10.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
