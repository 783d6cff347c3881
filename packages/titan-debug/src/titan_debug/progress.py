"""Progress of a long operation as text: done/total, percent, rate and time left.

``Progress`` measures from its first update, not from its creation: start-up work (compilation, the first
step's allocations, opening files) is not a rate the rest of the operation will run at. ``ProgressLine``
writes such a line to a stream (stderr by default), overwriting itself on a terminal and at most once per
``interval`` seconds elsewhere (a log file gets a few lines, not thousands).

    progress = ProgressLine(total=len(shards), unit="shard")
    for shard in shards:
        write(shard)
        progress.advance()
    progress.close()
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


def format_duration(seconds: float) -> str:
    """``1:02:03`` for an hour or more, ``2:05`` (minutes:seconds) below."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """Rate and estimated time left of ``total`` units, from the first ``update`` on."""

    def __init__(self, total: int | None, unit: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.unit, self._clock = total, unit, clock
        self._origin: tuple[int, float] | None = None
        self.done = 0

    def update(self, done: int) -> None:
        """``done`` units are finished (a count, not an increment)."""
        if self._origin is None:
            self._origin = (done, self._clock())
        self.done = done

    @property
    def rate(self) -> float | None:
        """Units per second since the first update; None until a unit finished after it."""
        if self._origin is None or self.done <= self._origin[0]:
            return None
        elapsed = self._clock() - self._origin[1]
        return (self.done - self._origin[0]) / elapsed if elapsed > 0 else None

    @property
    def eta_seconds(self) -> float | None:
        """Seconds until ``total`` at the measured rate; None while unknown."""
        rate = self.rate
        if rate is None or not self.total:
            return None
        return max(self.total - self.done, 0) / rate

    def line(self) -> str:
        """``12/50 24% 3.10 step/s eta 0:12`` (the parts that are known)."""
        parts = [f"{self.done}/{self.total}" if self.total else str(self.done)]
        if self.total:
            parts.append(f"{int(100 * min(self.done / self.total, 1.0))}%")
        if self.rate is not None:
            parts.append(f"{self.rate:.2f} {self.unit + '/s' if self.unit else '/s'}")
        if self.eta_seconds is not None:
            parts.append(f"eta {format_duration(self.eta_seconds)}")
        return " ".join(parts)


class ProgressLine:
    """A ``Progress`` written to ``stream`` as ``<label> <line>``, at most every ``interval`` seconds
    (always on the last unit)."""

    def __init__(
        self,
        total: int | None,
        label: str = "",
        unit: str = "",
        stream: TextIO | None = None,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.progress = Progress(total, unit, clock)
        self.label, self.interval, self._clock = label, interval, clock
        self.stream = stream if stream is not None else sys.stderr
        self._tty = getattr(self.stream, "isatty", lambda: False)()
        self._last_write: float | None = None
        self._open = False
        self.progress.update(0)

    def advance(self, units: int = 1) -> None:
        self.update(self.progress.done + units)

    def update(self, done: int) -> None:
        self.progress.update(done)
        now = self._clock()
        finished = self.progress.total is not None and done >= self.progress.total
        if finished or self._last_write is None or now - self._last_write >= self.interval:
            self._write()
            self._last_write = now

    def _write(self) -> None:
        text = f"{self.label} {self.progress.line()}".strip()
        if self._tty:
            self.stream.write(f"\r{text}\x1b[K")
            self._open = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
