"""The order documents are read in, per epoch: source order, or shuffled within blocks when a seed is given.

Shuffling within blocks of `SHUFFLE_BLOCK` consecutive documents needs neither the dataset's length nor
random access, so it works for streams too, and position p of epoch e always names the same document:
every rank computes the same order, and a resume at position p starts from the block holding p.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from itertools import islice

from titan_train.data.sources import DocumentSource

SHUFFLE_BLOCK = 1024


def epoch_documents(
    source: DocumentSource, epoch: int, start: int = 0, seed: int | None = None
) -> Iterator[tuple[int, str]]:
    """(position, text) for positions start, start+1, ... of epoch `epoch`'s document order."""
    if seed is None:
        yield from enumerate(source.documents(start), start)
        return
    block_start = start - start % SHUFFLE_BLOCK
    docs = source.documents(block_start)
    while block := list(islice(docs, SHUFFLE_BLOCK)):
        order = list(range(len(block)))
        # A str seed is hashed with SHA-512: the same order in every process and Python run.
        random.Random(f"{seed}/{epoch}/{block_start}").shuffle(order)
        for j in range(max(start - block_start, 0), len(block)):
            yield block_start + j, block[order[j]]
        block_start += len(block)
