"""A progress line for long conversions (export, import): an info line every PROGRESS_SECONDS with bytes done,
percent and seconds so far. titan-checkpoint depends on no sibling, so it has its own (titan-debug's
ProgressLine serves the trainer)."""

from __future__ import annotations

import logging
import time

logger = logging.getLogger("titan.checkpoint")

PROGRESS_SECONDS = 10.0


class ByteProgress:
    def __init__(self, total_bytes: int, what: str):
        self.total, self.what, self.done = total_bytes, what, 0
        self.start = self.last = time.perf_counter()

    def add(self, nbytes: int) -> None:
        self.done += nbytes
        now = time.perf_counter()
        if now - self.last >= PROGRESS_SECONDS:
            self.last = now
            logger.info(
                f"checkpoint: {self.what}: {self.done / 1e9:.2f} / {self.total / 1e9:.2f} GB "
                f"({100 * self.done / max(self.total, 1):.0f}%, {now - self.start:.0f}s)"
            )
