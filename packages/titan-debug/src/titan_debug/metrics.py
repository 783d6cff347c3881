"""One readable console line and one JSON line per logged step.

Console (through the ``logging`` logger "titan", at INFO, on the ranks in ``log_ranks``):

  step   12/50  [##........] 24%  loss 5.1234  grad_norm 1.234  lr 3.0e-04  tps 12,345  mfu 12.3%  mem 1.23GiB  eta 2:31

``eta`` (with ``total_steps``) is the time left at the rate measured since the first logged step, so
compilation and the first step's allocations do not inflate it; it is absent on the first logged step.

TensorBoard (optional, on the ranks in ``log_ranks``): every finite number of the record as a scalar at
``step``, in ``<tensorboard_dir>/rank<R>`` (see tensorboard.py; titan-train passes ``<dump_folder>/tb/<run>``).
Other writers (``writers``: objects with ``write(step, record)`` and ``close()``, such as the W&B writer in
wandb_logger.py) receive the same records on the rank that was given them.

JSONL (``<dump_folder>/metrics.jsonl``, rank 0 only for now), one object per logged step:

    {"step": 12, "time": 1.7e9, "run_id": "20260101-120000-1a2b3c", "restart": 0, "loss": 5.1234,
     "grad_norm": 1.234, "lr": 0.0003, "tps": 12345.0, "mfu": 0.123, "memory": 1.23, ...extra keys...}

``step``, ``time``, ``loss``, ``grad_norm``, ``lr``, ``tps``, ``mfu`` and ``memory`` are always present:
floats (``step`` an int, ``time`` Unix seconds), ``null`` when the caller did not give them or they are
not finite (strict JSON has no NaN). ``mfu`` is a fraction, ``memory`` peak GiB, ``tps`` tokens/s per
device. Extra keys (``tflops``, ``data_time_frac``, ``tps_total``, ...) are written as given.
``run_fields`` (titan-train gives ``run_id`` and ``restart``) follow ``time`` in every row.

The file is opened for appending, never truncated: a resumed run continues the same file, so a reader
should expect a step to appear more than once after a restart and keep the row of the highest ``restart``
(or, in files without one, the last occurrence).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from titan_debug.progress import Progress, format_duration
from titan_debug.tensorboard import TensorBoardWriter

logger = logging.getLogger("titan")

SCHEMA_KEYS = ("loss", "grad_norm", "lr", "tps", "mfu", "memory")

_BAR_WIDTH = 10


class MetricsLogger:
    """Logs one record per step to the console and TensorBoard (``log_ranks``) and to ``metrics.jsonl`` (rank 0).

    ``dump_folder=None`` disables the file; ``tensorboard_dir=None`` (the default) disables TensorBoard.
    ``total_steps`` (if known) adds ``/total``, a progress bar and a percentage to the console line. Other
    ranks may call ``log`` too; it does nothing for them. ``run_fields`` are written into every JSONL row;
    ``writers`` receive every record (see the module docstring).
    """

    def __init__(
        self,
        dump_folder: str | Path | None,
        rank: int,
        log_ranks: Sequence[int] = (0,),
        total_steps: int | None = None,
        jsonl_name: str = "metrics.jsonl",
        tensorboard_dir: str | Path | None = None,
        run_fields: Mapping[str, Any] | None = None,
        writers: Sequence[Any] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rank = rank
        self.total_steps = total_steps
        self.run_fields = dict(run_fields or {})
        self._progress = Progress(total_steps, unit="step", clock=clock)
        self._prints = rank in set(log_ranks)
        # Only rank 0 writes: per-rank files (e.g. metrics_rank{r}.jsonl) may come later.
        self.path = Path(dump_folder) / jsonl_name if dump_folder is not None and rank == 0 else None
        self._file = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
            # A run killed mid-write leaves a partial last line; start ours on a fresh one.
            if self._file.tell() > 0 and not _ends_with_newline(self.path):
                self._file.write("\n")
        self._tensorboard = TensorBoardWriter(tensorboard_dir, rank) if tensorboard_dir and self._prints else None
        self._writers = list(writers)

    def log(self, step: int, record: Mapping[str, Any]) -> None:
        """Print the step's line and write its scalars (on logging ranks); append it to the JSONL file (rank 0)."""
        if not self._prints and self._file is None and not self._writers:
            return
        values = {key: _to_plain(value) for key, value in record.items()}
        self._progress.update(int(step))
        if self._prints:
            logger.info(self.format_line(step, values))
        if self._tensorboard is not None:
            self._tensorboard.write(step, values)
        for writer in self._writers:
            writer.write(step, values)
        if self._file is not None:
            row: dict[str, Any] = {"step": int(step), "time": time.time(), **self.run_fields}
            for key in SCHEMA_KEYS:
                row[key] = _to_float(values.get(key))
            for key, value in values.items():
                if key not in row:
                    row[key] = _finite_or_none(value)
            self._file.write(json.dumps(row, default=str, allow_nan=False) + "\n")
            self._file.flush()

    def format_line(self, step: int, record: Mapping[str, Any]) -> str:
        """The console line for ``record``; keys the record lacks are left out, ``None`` shows as n/a."""
        width = max(4, len(str(self.total_steps or "")))
        parts = [f"step {step:>{width}}"]
        if self.total_steps:
            frac = min(max(step / self.total_steps, 0.0), 1.0)
            filled = int(frac * _BAR_WIDTH)
            parts[0] += f"/{self.total_steps}"
            parts.append(f"[{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] {int(frac * 100):>2}%")
        for key, label, fmt in _console_fields(record):
            if key in record:
                value = record[key]
                if isinstance(value, Mapping):  # one value per rank, e.g. per pipeline rank
                    shown = "|".join("n/a" if v is None else fmt(float(v)) for v in value.values())
                elif isinstance(value, str):  # a figure that is not a number, e.g. replicas "1/2"
                    shown = value
                else:
                    shown = "n/a" if value is None else fmt(float(value))
                parts.append(f"{label} {shown}")
        eta = self._progress.eta_seconds if self._progress.done == step else None
        if eta is not None:
            parts.append(f"eta {format_duration(eta)}")
        return "  ".join(parts)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        for writer in self._writers:
            writer.close()
        self._writers = []

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_CONSOLE_FIELDS = (
    ("loss", "loss", lambda v: f"{v:.4f}"),
    ("grad_norm", "grad_norm", lambda v: f"{v:.3f}"),
    ("lr", "lr", lambda v: f"{v:.1e}"),
    ("tps", "tps", lambda v: f"{v:,.0f}" if math.isfinite(v) else str(v)),
    ("mfu", "mfu", lambda v: f"{100 * v:.1f}%"),
    ("memory", "mem", lambda v: f"{v:.2f}GiB"),
    ("memory_pp", "mem/pp-rank", lambda v: f"{v:.2f}GiB"),
    ("aux_loss", "aux_loss", lambda v: f"{v:.4f}"),
    ("expert_imbalance", "imbalance", lambda v: f"{v:.2f}"),
    ("max_logit", "max_logit", lambda v: f"{v:.2f}"),  # largest attention logit of the step (titan-train QK-clip)
    ("validation_loss", "validation_loss", lambda v: f"{v:.4f}"),
    ("validation_perplexity", "validation_perplexity", lambda v: f"{v:.2f}"),
    ("replicas", "replicas", str),  # replica groups that trained the step / all (titan-train fault tolerance)
)


def _console_fields(record: Mapping[str, Any]) -> list[tuple]:
    """The console's fields: multi-token prediction's per-depth losses (mtp_loss_1, .., titan-train's model.mtp_layers)
    right after the main loss, as "mtp1 .."."""
    depths = sorted(int(key[9:]) for key in record if key.startswith("mtp_loss_") and key[9:].isdigit())
    mtp = [(f"mtp_loss_{k}", f"mtp{k}", _CONSOLE_FIELDS[0][2]) for k in depths]
    return [_CONSOLE_FIELDS[0], *mtp, *_CONSOLE_FIELDS[1:]]


def _to_plain(value: Any) -> Any:
    """A one-element tensor becomes its Python number (this syncs with the device, once per log step)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return value


def _to_float(value: Any) -> float | None:
    if value is None:
        return None
    return _finite_or_none(float(value))


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _finite_or_none(_to_plain(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(_to_plain(v)) for v in value]
    return value


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"\n"
