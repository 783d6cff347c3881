"""A weighted mixture of document sources (`training.dataset_mixture`), as one endless document source.

Weights are shares of documents. The mixture is laid out in periods of PERIOD positions: each period holds
the same number of documents of each source (its weight's share of PERIOD, largest remainders first), spread
evenly over the period in a fixed pattern. So position p names document
    (p // PERIOD) * count[s] + (documents of s in the pattern before p % PERIOD)
of source s = pattern[p % PERIOD], found in O(1) (plus the source's own seek): every rank agrees on it, a
resume starts right there, and a reshard works as for any source. No randomness is involved; the trainer's
seeded order (order.py) shuffles positions within blocks as for any source. Each source cycles on its own
when it runs out, so the mixture never ends (one endless epoch) and a small source is repeated as often as
its weight asks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from titan_train.data.dataset_keys import DatasetKeys

PERIOD = 1 << 16
KEYS = ("path", "weight", "dataset", "text_field")


class Mixture:
    def __init__(self, sources: Sequence[Any], weights: Sequence[float]):
        self.sources = list(sources)
        self.name = "mixture(" + ", ".join(f"{s.name}: {w:g}" for s, w in zip(sources, weights, strict=True)) + ")"
        self.counts = period_counts(weights)
        self.pattern = _pattern(self.counts)
        self._lengths: list[int | None] = [len(s) if hasattr(s, "__len__") else None for s in self.sources]

    def documents(self, start: int = 0) -> Iterator[Any]:
        cursors = [self._cycle(s, self._first_at_or_after(s, start)) for s in range(len(self.sources))]
        j = start % PERIOD
        while True:
            for s in self.pattern[j:]:
                yield next(cursors[s])
            j = 0

    def _first_at_or_after(self, s: int, position: int) -> int:
        """Index in source s's cycle of its first document at a position >= `position`."""
        period, j = divmod(position, PERIOD)
        return period * int(self.counts[s]) + self.pattern[:j].count(s)

    def _cycle(self, s: int, index: int) -> Iterator[Any]:
        """Source s's documents from `index` of its endless repetition."""
        source = self.sources[s]
        if self._lengths[s] == 0:
            raise ValueError(f"mixture source {source.name!r} has no documents")
        if self._lengths[s] is not None:
            index %= self._lengths[s]
        taken = 0
        for doc in source.documents(index):
            taken += 1
            yield doc
        if not taken:  # index was past the end: learn the length by counting once
            self._lengths[s] = sum(1 for _ in source.documents(0))
            if not self._lengths[s]:
                raise ValueError(f"mixture source {source.name!r} has no documents")
            yield from self._cycle(s, index)
            return
        self._lengths[s] = index + taken
        while True:
            yield from source.documents(0)


def period_counts(weights: Sequence[float]) -> np.ndarray:
    """Documents of each source per period: shares of PERIOD by weight, largest remainders rounded up."""
    # Exact arithmetic: equal remainders are equal (then the earlier source wins), not float noise.
    total = sum(Fraction(w) for w in weights)
    exact = [PERIOD * Fraction(w) / total for w in weights]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[: PERIOD - sum(counts)]:
        counts[i] += 1
    return np.asarray(counts, dtype=np.int64)


def _pattern(counts: np.ndarray) -> np.ndarray:
    """The source of each position of a period, each source's documents evenly spaced (the k-th of n at
    (k + 1/2) / n of the period)."""
    ideal = np.concatenate([(np.arange(n) + 0.5) / n for n in counts])
    owner = np.concatenate([np.full(n, s, dtype=np.int64) for s, n in enumerate(counts)])
    return owner[np.argsort(ideal, kind="stable")].tolist()


def parse_mixture(
    entries: list[dict], resolve: Callable[[str, str, str], Any], text_field: str
) -> tuple[list[Any], list[float]]:
    """`training.dataset_mixture` entries -> (sources, weights); ValueError naming the entry and key."""
    sources, weights = [], []
    for i, entry in enumerate(entries):
        key = f"training.dataset_mixture[{i}]"
        unknown = sorted(set(entry) - set(KEYS))
        if unknown:
            raise ValueError(f"{key} has unknown keys {unknown}; an entry takes {', '.join(KEYS)}")
        weight = entry.get("weight")
        if (
            isinstance(weight, bool)
            or not isinstance(weight, (int, float))
            or not (math.isfinite(weight) and weight > 0)
        ):
            raise ValueError(f"{key}.weight={weight!r} must be a number > 0 (a share of documents, any scale)")
        dataset = entry.get("dataset", "text")
        path, field = entry.get("path", ""), entry.get("text_field", text_field)
        for name, value in (("dataset", dataset), ("path", path), ("text_field", field)):
            if not isinstance(value, str):
                raise ValueError(f"{key}.{name}={value!r} must be a string")
        sources.append(resolve(dataset, path, field, DatasetKeys(f"{key}.dataset", f"{key}.path", f"{key}.text_field")))
        weights.append(float(weight))
    if not entries:
        raise ValueError("training.dataset_mixture is empty")
    small = [i for i, n in enumerate(period_counts(weights)) if n == 0]
    if small:
        raise ValueError(
            f"training.dataset_mixture[{small[0]}].weight={entries[small[0]]['weight']!r} is below 1/{PERIOD} of the "
            f"total weight {sum(weights):g}: the source would never be read; raise it or remove the entry"
        )
    return sources, weights
