"""TensorBoard scalars for the metrics records, one event-file directory per logging rank.

    <dump_folder>/tb/<run_name>/rank<R>/events.out.tfevents...

View with ``tensorboard --logdir <dump_folder>/tb``: each run is a folder and each rank a sub-run, so the
ranks of one run and several runs can be overlaid. Every finite number in a record becomes a scalar at the
record's step under its key; a nested mapping (``{"memory": {"peak_gib": 1.2}}``) becomes ``memory/peak_gib``.
Strings, ``None``, booleans and non-finite values are left out.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from numbers import Real
from pathlib import Path
from typing import Any


class TensorBoardWriter:
    """Writes records as scalars to ``<log_dir>/rank<rank>``."""

    def __init__(self, log_dir: str | Path, rank: int) -> None:
        # Imported here: tensorboard takes ~1.5 s to import and most processes never write events.
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir) / f"rank{rank}"
        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def write(self, step: int, record: Mapping[str, Any]) -> None:
        for tag, value in scalars(record):
            self._writer.add_scalar(tag, value, global_step=int(step))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def scalars(record: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """``(tag, value)`` for every finite number in ``record``, nested mappings flattened with ``/``."""
    for key, value in record.items():
        tag = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from scalars(value, prefix=f"{tag}/")
        elif isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value):
            yield tag, float(value)
