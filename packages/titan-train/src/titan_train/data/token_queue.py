"""Tokens waiting to be cut into windows, held as the arrays they came in: a reader of the global order
(global_order.py) drops most windows unread, and dropping costs no copy."""

from __future__ import annotations

from collections import deque

import numpy as np


class TokenQueue:
    def __init__(self, tokens=()):
        self._pieces: deque[np.ndarray] = deque()
        self._head = 0  # tokens of the first piece already taken
        self.size = 0
        self.append(np.asarray(tokens, dtype=np.int64))

    def append(self, tokens: np.ndarray) -> None:
        if len(tokens):
            self._pieces.append(tokens)
            self.size += len(tokens)

    def skip(self, n: int) -> None:
        self.size -= n
        while n:
            first = self._pieces[0]
            step = min(n, len(first) - self._head)
            n -= step
            self._head += step
            if self._head == len(first):
                self._pieces.popleft()
                self._head = 0

    def take(self, n: int) -> np.ndarray:
        """The next n tokens (a new array), removed from the queue."""
        out, filled = np.empty(n, dtype=np.int64), 0
        while filled < n:
            first = self._pieces[0]
            step = min(n - filled, len(first) - self._head)
            out[filled : filled + step] = first[self._head : self._head + step]
            filled += step
            self.skip(step)
        return out

    def tokens(self) -> np.ndarray:
        """Every token in the queue (a new array), the queue unchanged."""
        parts = list(self._pieces)
        if parts:
            parts[0] = parts[0][self._head :]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)
