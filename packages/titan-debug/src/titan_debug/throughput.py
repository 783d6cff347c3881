"""Tokens per second, and how much of that time went to waiting for data, between two log steps."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class ThroughputWindow:
    """What happened between two ``Throughput.lap()`` calls."""

    tokens: int
    seconds: float
    data_seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def data_time_frac(self) -> float:
        """Fraction of the window spent inside ``Throughput.data_wait()``."""
        return min(self.data_seconds / self.seconds, 1.0) if self.seconds > 0 else 0.0


class Throughput:
    """Counts this rank's tokens and data-wait time over a window of steps; ``lap()`` closes the window.

    Count the tokens this rank processed (local batch * sequence length), so ``tokens_per_second`` is per
    device, which is what MFU needs; the run-wide number is that times the data-parallel degree.

        throughput = Throughput()
        for step in ...:
            with throughput.data_wait():
                batch = next(data_iter)
            ...train step...
            throughput.add_tokens(batch.numel())
            if step % log_freq == 0:
                window = throughput.lap()   # window.tokens_per_second, window.data_time_frac

    The first window starts at construction; call ``reset()`` just before the loop to leave setup out.
    Timings are host wall-clock: on an accelerator, synchronize (e.g. read the loss) before ``lap()``.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self.reset()

    def reset(self) -> None:
        """Start a new, empty window now."""
        self._start = self._clock()
        self._tokens = 0
        self._data_seconds = 0.0

    def add_tokens(self, n: int) -> None:
        self._tokens += int(n)

    def add_data_time(self, seconds: float) -> None:
        """Record time spent waiting for data measured elsewhere (alternative to ``data_wait``)."""
        self._data_seconds += seconds

    @contextmanager
    def data_wait(self) -> Iterator[None]:
        """Time the enclosed block as waiting for data."""
        t0 = self._clock()
        try:
            yield
        finally:
            self._data_seconds += self._clock() - t0

    @contextmanager
    def excluded(self) -> Iterator[None]:
        """Leave the enclosed block (e.g. an evaluation) out of the window: its time counts for nothing."""
        t0 = self._clock()
        try:
            yield
        finally:
            self._start += self._clock() - t0

    def lap(self) -> ThroughputWindow:
        """Close the current window, return its numbers and start the next one."""
        now = self._clock()
        window = ThroughputWindow(self._tokens, now - self._start, self._data_seconds)
        self._start = now
        self._tokens = 0
        self._data_seconds = 0.0
        return window
