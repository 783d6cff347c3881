"""The document-sharded order (dataset.py): which reader takes which document, and how a new data-parallel
layout resumes from an old one's states.

A reader is a data-parallel rank, or one DataLoader worker of a rank: reader i of n takes the positions p
with p % n == i of every epoch's document order (order.py). Its state (epoch, next_doc, skip) means: it has
taken each of its positions before (epoch, next_doc), none after, and will pass over the positions covered
by `skip`, documents that an earlier layout consumed. So the states of all readers of a layout say exactly
which documents were consumed, whatever their epochs: readers run ahead of each other because documents
differ in length, across epoch boundaries too.

Resharding (`resharded_state`): every new reader starts at the earliest old position and skips what the
old readers had consumed after it, as stripes: "positions start <= p < stop of epoch e with p % n == i",
a few per old reader (one more per epoch it was ahead), so the state stays small however long the run.
Each old reader's leftover tokens (documents it had started) go to new dp rank i % new_size, which emits
them first. Neither needs the number of documents, so streamed sources reshard too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# [epoch, start, stop, every, offset]: positions p of epoch `epoch` with start <= p < stop (stop None: to
# the end of the epoch) and p % every == offset.
Stripe = tuple[int, int, int | None, int, int]


def reader_shard(dp_rank: int, dp_world_size: int, worker_id: int = 0, num_workers: int = 1) -> tuple[int, int]:
    """(index, count) of a reader: dp ranks, each split over its DataLoader workers."""
    return dp_rank + dp_world_size * worker_id, dp_world_size * num_workers


def covers(stripes: list[Stripe], epoch: int, position: int) -> bool:
    return any(
        e == epoch and start <= position and (stop is None or position < stop) and position % every == offset
        for e, start, stop, every, offset in stripes
    )


def live_stripes(stripes: list[Stripe], epoch: int, next_doc: int, index: int, count: int) -> list[Stripe]:
    """The stripes that may still cover a position reader `index` of `count` has not reached."""
    return [
        (e, start, stop, every, offset)
        for e, start, stop, every, offset in stripes
        if (e > epoch or (e == epoch and (stop is None or stop > next_doc)))
        and (offset - index) % math.gcd(every, count) == 0  # some p has p % every == offset, p % count == index
    ]


@dataclass(frozen=True)
class ReaderState:
    """One old reader: its index among `count` readers and its PackedTokenDataset state."""

    index: int
    count: int
    state: dict[str, Any]

    @property
    def position(self) -> tuple[int, int]:
        return self.state["epoch"], self.state["next_doc"]


def resharded_state(readers: list[ReaderState], dp_rank: int, dp_world_size: int) -> dict[str, Any]:
    """The PackedTokenDataset state data-parallel rank `dp_rank` of `dp_world_size` starts from, given the
    states of every reader of the old layout (shared by this rank's workers, see PackedTokenDataset)."""
    count = readers[0].count if readers else 0
    indices = sorted(r.index for r in readers)
    if not readers or any(r.count != count for r in readers) or indices != list(range(count)):
        raise ValueError(
            f"the saved dataloader states are not those of one complete layout: readers {indices} of "
            f"{sorted({r.count for r in readers})} (the state of every dp rank, and of each of its workers, is needed)"
        )
    start = min(r.position for r in readers)
    skip: set[Stripe] = set()
    for r in readers:
        skip.update(tuple(s) for s in r.state.get("skip", ()))
        skip.update(_taken_since(start, r))
    handed = sorted((r for r in readers if r.index % dp_world_size == dp_rank), key=lambda r: r.index)
    buffer = [t for r in handed for t in r.state["token_buffer"]]
    return {
        "epoch": start[0],
        "next_doc": start[1],
        "token_buffer": buffer,
        "skip": [list(s) for s in sorted(skip, key=_sort_key)],
        "dp_rank": dp_rank,
        "dp_world_size": dp_world_size,
    }


def _taken_since(start: tuple[int, int], reader: ReaderState) -> list[Stripe]:
    """Reader's positions from `start` up to its own position, which it has taken."""
    (e0, p0), (e1, p1) = start, reader.position
    n, i = reader.count, reader.index
    if (e1, p1) <= (e0, p0):
        return []
    if e1 == e0:
        return [(e0, p0, p1, n, i)]
    whole = [(e, 0, None, n, i) for e in range(e0 + 1, e1)]
    return [(e0, p0, None, n, i), *whole, *([(e1, 0, p1, n, i)] if p1 else [])]


def _sort_key(s: Stripe) -> tuple:
    return s[0], s[1], math.inf if s[2] is None else s[2], s[3], s[4]
