"""The layout-invariant data order (`training.data_order = "global"`, the default): one packed stream of
sequences for the whole job, and each step's global batch is the next `global_batch` sequences of it, whatever
the data-parallel degree, gradient accumulation and number of DataLoader workers.

The stream is the packer's (dataset.py) for a single reader: every document of the epoch's order (order.py),
framed BOS + tokens + EOS, concatenated and cut into windows of seq_len + 1 tokens; window k is sequence k of
the run (epochs follow each other). Optimizer step s trains on windows origin + s*G .. origin + (s+1)*G - 1
(G = local_batch x dp x accumulation); data-parallel rank r takes rows [r*G/dp, (r+1)*G/dp) of them, its
micro-batch m rows m*local_batch .. of its share, so its local batch b = s*accumulation + m is

    windows origin + (b // A) * G + r * A * L + (b % A) * L + [0, L)        (A accumulation, L local batch)

and with W workers, worker w produces the rank's batches b with b % W == w (StatefulDataLoader takes batches
from its workers round robin, starting at worker 0). Every reader packs the whole stream and keeps its own
windows: exact and simple, at the price of tokenizing every document on every reader (free for pre-tokenized
data, cheap for the embedded corpus; see tools/bench_dataloader.py for raw text, and the document-sharded
order in dataset.py for corpora where that is too much).

State (exact between batches): the stream as it stood at the start of the step of the reader's last batch
(`epoch`, `next_doc`, `token_buffer`, `window`: the next window to cut), `next_batch` (its batches below it
are done), and the geometry that maps batches to windows (`origin`, `global_batch`, `local_batch`,
`dp_world_size`). After a whole step every rank's state is the same, so a checkpoint holds one global
position, and another layout (`resharded`) starts a new geometry at the first window of the next step.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from itertools import islice
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info
from torchdata.stateful_dataloader import Stateful

from titan_train.data.order import epoch_documents
from titan_train.data.sources import DocumentSource
from titan_train.data.token_queue import TokenQueue
from titan_train.data.tokenizer import Tokenizer

logger = logging.getLogger("titan")

ORDER = "global"
# Documents are tokenized in chunks (one encode_batch call each) growing from the first to the last size, as
# in dataset.py: the first batch comes quickly, later chunks keep the tokenizer's threads busy.
_FIRST_CHUNK, _LAST_CHUNK = 8, 256
_GEOMETRY = ("origin", "global_batch", "local_batch", "dp_world_size")


class GlobalOrderDataset(IterableDataset, Stateful):
    """Yields (inputs, labels) LongTensors of shape [seq_len]: this reader's rows of the global stream, in the
    order its batches need them (see the module docstring). Infinite unless `infinite=False`."""

    def __init__(
        self,
        source: DocumentSource,
        tokenizer: Tokenizer,
        seq_len: int,
        local_batch_size: int,
        dp_rank: int = 0,
        dp_world_size: int = 1,
        accumulation_steps: int = 1,
        seed: int | None = None,
        infinite: bool = True,
    ):
        self.source, self.tokenizer, self.seq_len, self.seed = source, tokenizer, seq_len, seed
        self.local_batch, self.dp_rank, self.dp_world_size = local_batch_size, dp_rank, dp_world_size
        self.accumulation, self.infinite = accumulation_steps, infinite
        self.global_batch = local_batch_size * dp_world_size * accumulation_steps
        self._origin = 0
        self._next_batch = 0
        # The stream at the last step start this reader passed: what state_dict() saves.
        self._bookmark: dict[str, Any] = {"epoch": 0, "next_doc": 0, "token_buffer": [], "window": 0}

    # -- which windows are this reader's ---------------------------------------------------------------------

    def _batch_of(self, window: int) -> int | None:
        """This rank's local batch index that holds `window`, or None when another rank's (or before origin)."""
        rel = window - self._origin
        if rel < 0:
            return None
        step, row = divmod(rel, self.global_batch)
        rank, row = divmod(row, self.local_batch * self.accumulation)
        return step * self.accumulation + row // self.local_batch if rank == self.dp_rank else None

    # -- iteration -------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        mark = self._bookmark
        self._epoch, self._next_doc, self._window = mark["epoch"], mark["next_doc"], mark["window"]
        self._queue = TokenQueue(mark["token_buffer"])
        while True:
            yield from self._cut(worker, workers)
            started_at_zero, took_any = self._next_doc == 0, False
            for position, ids in self._tokenized(self._epoch, self._next_doc):
                self._queue.append(ids)
                self._next_doc, took_any = position + 1, True
                yield from self._cut(worker, workers)
            if not self.infinite:
                return
            if started_at_zero and not took_any:
                raise ValueError(f"dataset {self.source.name!r} has no documents")
            self._epoch, self._next_doc = self._epoch + 1, 0

    def _cut(self, worker: int, workers: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Cut the queued tokens into windows, yielding this reader's, bookmarking each step's start."""
        size, queue = self.seq_len + 1, self._queue
        while queue.size >= size:
            window = self._window
            if window >= self._origin and (window - self._origin) % self.global_batch == 0:
                self._bookmark = {
                    "epoch": self._epoch, "next_doc": self._next_doc, "token_buffer": queue.tokens(), "window": window
                }  # fmt: skip
            batch = self._batch_of(window)
            self._window += 1
            if batch is not None and batch >= self._next_batch and batch % workers == worker:
                w = torch.from_numpy(queue.take(size))
                if (window - self._origin) % self.local_batch == self.local_batch - 1:
                    self._next_batch = batch + 1  # before the yield: state_dict() runs while it is suspended
                yield w[:-1], w[1:]
            else:
                queue.skip(size)

    def _tokenized(self, epoch: int, start: int) -> Iterator[tuple[int, np.ndarray]]:
        docs = epoch_documents(self.source, epoch, start, self.seed)
        bos, eos = self.tokenizer.bos_id, self.tokenizer.eos_id
        size = _FIRST_CHUNK
        while chunk := list(islice(docs, size)):
            texts = [doc for _, doc in chunk if isinstance(doc, str)]
            encoded = iter(self.tokenizer.encode_batch(texts) if texts else ())
            for p, doc in chunk:
                if isinstance(doc, str):
                    yield p, np.asarray(next(encoded), dtype=np.int64)
                else:  # a pre-tokenized document (an array of ids, tokens.py), framed as the tokenizer frames text
                    framed = np.empty(len(doc) + 2, dtype=np.int64)
                    framed[0], framed[1:-1], framed[-1] = bos, doc, eos
                    yield p, framed
            size = min(2 * size, _LAST_CHUNK)

    # -- state -----------------------------------------------------------------------------------------------

    def geometry(self) -> dict[str, int]:
        return {
            "origin": self._origin,
            "global_batch": self.global_batch,
            "local_batch": self.local_batch,
            "dp_world_size": self.dp_world_size,
        }

    def state_dict(self) -> dict[str, Any]:
        mark = self._bookmark
        return {
            "order": ORDER,
            **{key: mark[key] for key in ("epoch", "next_doc", "window")},
            "token_buffer": np.asarray(mark["token_buffer"], dtype=np.int64).tolist(),
            "next_batch": self._next_batch,
            **self.geometry(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A state of this geometry (exact resume; takes effect at the next `iter()`). Another layout's state
        goes through `resharded_state` first."""
        check_order(state_dict)
        saved = {key: state_dict[key] for key in _GEOMETRY[1:]}
        mine = {key: value for key, value in self.geometry().items() if key in saved}
        if saved != mine:
            raise ValueError(
                f"dataloader state of another layout ({saved}) loaded by {mine}; pass it through resharded_state"
            )
        self._origin = state_dict["origin"]
        self._next_batch = state_dict["next_batch"]
        self._bookmark = {
            "epoch": state_dict["epoch"],
            "next_doc": state_dict["next_doc"],
            "token_buffer": list(state_dict["token_buffer"]),
            "window": state_dict["window"],
        }


def check_order(state: dict[str, Any]) -> None:
    """ValueError, naming the fix, for a dataloader state of the document-sharded order."""
    if state.get("order") != ORDER:
        raise ValueError(
            "the checkpoint's dataloader state was saved with per-rank document shards (titan-train before the "
            "layout-invariant data order, or training.data_order='document_sharded'); set "
            "training.data_order='document_sharded' to resume it"
        )


def next_window(readers: list[tuple[int, int, dict[str, Any]]]) -> int:
    """The first window of the step after the last one a loader delivered, from its readers (worker id,
    number of workers, dataset state): the loader has delivered every batch below the smallest batch one of
    its workers would produce next. ValueError when that is not a step boundary."""
    for _, _, state in readers:
        check_order(state)
    first = min(_next_own_batch(state["next_batch"], worker, workers) for worker, workers, state in readers)
    state = readers[0][2]
    accumulation = state["global_batch"] // (state["local_batch"] * state["dp_world_size"])
    if first % accumulation:
        raise ValueError(
            f"the dataloader state is in the middle of an optimizer step (micro-batch {first % accumulation} of "
            f"{accumulation}); only the same layout can resume it: checkpoints are taken between steps"
        )
    return state["origin"] + first // accumulation * state["global_batch"]


def _next_own_batch(next_batch: int, worker: int, workers: int) -> int:
    return next_batch + (worker - next_batch) % workers


def resharded_state(ranks: list[list[tuple[int, int, dict[str, Any]]]], dataset: GlobalOrderDataset) -> dict[str, Any]:
    """The state `dataset` (any layout) starts from to continue the loaders whose readers are `ranks` (one
    list per old dp rank, or any subset: they hold the same global position) at the next step's first window.
    ValueError when they disagree (not states of one step of one run)."""
    starts = {next_window(readers) for readers in ranks}
    if len(starts) != 1:
        raise ValueError(
            f"the saved dataloader states of the data-parallel ranks are at different positions (windows "
            f"{sorted(starts)}): they are not the states of one training step"
        )
    (start,) = starts
    marks = [state for readers in ranks for _, _, state in readers]
    mark = max(marks, key=lambda s: s["window"])  # every bookmark is at or before `start`: take the nearest
    old = mark["global_batch"]
    if old != dataset.global_batch and dataset.dp_rank == 0:
        logger.warning(
            f"the checkpoint was trained with a global batch of {old} sequences, this run's is "
            f"{dataset.global_batch} (local {dataset.local_batch} x data-parallel {dataset.dp_world_size} x "
            f"accumulation {dataset.accumulation}); set training.global_batch_size={old} to keep the optimization "
            "unchanged"
        )
    return {
        "order": ORDER,
        **{key: mark[key] for key in ("epoch", "next_doc", "window", "token_buffer")},
        "next_batch": 0,
        **dataset.geometry(),
        "origin": start,
    }
