"""Documents -> fixed-length training samples: tokenize, frame with BOS/EOS, concatenate, cut into windows;
the document-sharded order (`training.data_order = "document_sharded"`; the default global order, which packs
the same way for one reader, is global_order.py).

Each document becomes BOS + tokens + EOS (a pre-tokenized document, an array of ids, skips the tokenizer
and is framed the same way); the stream of documents is concatenated and cut into
non-overlapping windows of seq_len + 1 tokens, and a window w gives inputs w[:-1] and labels w[1:] (as
TorchTitan's HuggingFaceDataset). Documents are sharded over data-parallel ranks by their global position
in the epoch's order: position i goes to rank i % dp_world_size. DataLoader workers split a rank's share
the same way, each packing its own documents, so a rank reads each of its documents once per epoch
whatever its number of workers (the windows, though, depend on that number). A run saved on one
data-parallel size resumes on another through `load_resharded` (sharding.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info
from torchdata.stateful_dataloader import Stateful

from titan_train.data.order import epoch_documents
from titan_train.data.sharding import ReaderState, Stripe, covers, live_stripes, reader_shard, resharded_state
from titan_train.data.sources import DocumentSource
from titan_train.data.tokenizer import Tokenizer

# Documents are tokenized lazily in chunks (one encode_batch call each) that grow from the first to the
# last size: the first batch comes quickly, later chunks keep the tokenizer's threads busy.
_FIRST_CHUNK, _LAST_CHUNK = 8, 256


class PackedTokenDataset(IterableDataset, Stateful):
    """Yields (inputs, labels) LongTensors of shape [seq_len]; infinite (re-looping, counting epochs) unless
    `infinite=False`.

    State (`state_dict()`), exact between any two samples, so resume replays and skips nothing:
        epoch          passes over the data completed
        next_doc       global position, in epoch `epoch`'s document order, of the next document this reader
                       would take (positions of other ranks' documents included)
        token_buffer   tokens of taken documents not yet emitted (fewer than one window + one document,
                       more right after a reshard: the old ranks' leftovers)
        skip           stripes of positions at or after next_doc that an earlier layout consumed (empty
                       unless the run was resharded; sharding.py)
        dp_rank, dp_world_size   the layout the state belongs to

    `load_state_dict` takes a state of the same layout (exact resume). `load_resharded` takes the states
    of every reader of another layout: since (epoch, next_doc) is a global position, they say exactly
    which documents were consumed (sharding.py).
    """

    def __init__(
        self,
        source: DocumentSource,
        tokenizer: Tokenizer,
        seq_len: int,
        dp_rank: int = 0,
        dp_world_size: int = 1,
        seed: int | None = None,
        infinite: bool = True,
    ):
        self.source, self.tokenizer, self.seq_len = source, tokenizer, seq_len
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size
        self.seed, self.infinite = seed, infinite
        self._epoch = 0
        self._next_doc = 0
        self._buffer: list[int] = []
        self._skip: list[Stripe] = []
        # After load_resharded the state is the dp rank's, copied into each of its workers: the first
        # worker keeps the handed-over tokens, the others drop them (see _settle).
        self._rank_wide = False

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        rank, world = self._reader_shard()
        self._settle()
        while True:
            yield from self._drain()
            started_at_zero, took_any = self._next_doc == 0, False
            for position, ids in self._tokenized_documents(rank, world):
                self._buffer.extend(ids)
                self._next_doc = position + 1
                took_any = True
                yield from self._drain()
            if not self.infinite:
                return
            if started_at_zero and not took_any and not any(s[0] == self._epoch for s in self._skip):
                readers = f" (reader {rank} of {world} with workers)" if world > self.dp_world_size else ""
                raise ValueError(
                    f"dataset {self.source.name!r} has no documents for data-parallel rank "
                    f"{self.dp_rank} of {self.dp_world_size}{readers}: it has fewer documents "
                    f"than readers"
                )
            self._epoch += 1
            self._next_doc = 0
            self._skip = [s for s in self._skip if s[0] >= self._epoch]

    def _drain(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        window = self.seq_len + 1
        while len(self._buffer) >= window:
            w = torch.tensor(self._buffer[:window], dtype=torch.long)
            del self._buffer[:window]
            yield w[:-1], w[1:]

    def _tokenized_documents(self, rank: int, world: int) -> Iterator[tuple[int, list[int]]]:
        docs = epoch_documents(self.source, self._epoch, self._next_doc, self.seed)
        skip = [s for s in self._skip if s[0] == self._epoch]
        mine = ((p, text) for p, text in docs if p % world == rank and not (skip and covers(skip, self._epoch, p)))
        size = _FIRST_CHUNK
        while chunk := list(islice(mine, size)):
            texts = [doc for _, doc in chunk if isinstance(doc, str)]
            encoded = iter(self.tokenizer.encode_batch(texts) if texts else ())
            for p, doc in chunk:
                yield p, next(encoded) if isinstance(doc, str) else self._framed(doc)
            size = min(2 * size, _LAST_CHUNK)

    def _framed(self, tokens) -> list[int]:
        """A pre-tokenized document (an array of ids, tokens.py) framed as the tokenizer frames text."""
        return [self.tokenizer.bos_id, *tokens.tolist(), self.tokenizer.eos_id]

    def _reader_shard(self) -> tuple[int, int]:
        """(index, count) of this reader among all readers: dp ranks, each split over its workers."""
        info = get_worker_info()
        if info is None:
            return self.dp_rank, self.dp_world_size
        return reader_shard(self.dp_rank, self.dp_world_size, info.id, info.num_workers)

    def _settle(self) -> None:
        """Make a rank-wide state (from load_resharded) this reader's own; runs in the reader's process."""
        if self._rank_wide:
            info = get_worker_info()
            if info is not None and info.id > 0:
                self._buffer = []
            self._rank_wide = False

    def state_dict(self) -> dict[str, Any]:
        self._settle()
        return {
            "epoch": self._epoch,
            "next_doc": self._next_doc,
            "token_buffer": list(self._buffer),
            "skip": [list(s) for s in live_stripes(self._skip, self._epoch, self._next_doc, *self._reader_shard())],
            "dp_rank": self.dp_rank,
            "dp_world_size": self.dp_world_size,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Takes effect at the next `iter()`."""
        saved = (state_dict["dp_rank"], state_dict["dp_world_size"])
        if saved != (self.dp_rank, self.dp_world_size):
            raise ValueError(
                f"dataloader state was saved by data-parallel rank {saved[0]} of {saved[1]} but "
                f"is loaded by rank {self.dp_rank} of {self.dp_world_size}; to resume on another "
                f"data-parallel size, pass the states of all old ranks to load_resharded"
            )
        self._epoch = state_dict["epoch"]
        self._next_doc = state_dict["next_doc"]
        self._buffer = list(state_dict["token_buffer"])
        self._skip = [tuple(s) for s in state_dict.get("skip", ())]
        self._rank_wide = False

    def load_resharded(self, readers: list[ReaderState]) -> None:
        """Resume from the states of every reader of another layout (takes effect at the next `iter()`):
        the documents none of them consumed are dealt over this layout, this rank first emitting the
        leftover tokens of the old readers i with i % dp_world_size == dp_rank."""
        state = resharded_state(readers, self.dp_rank, self.dp_world_size)
        self.load_state_dict(state)
        self._rank_wide = True
