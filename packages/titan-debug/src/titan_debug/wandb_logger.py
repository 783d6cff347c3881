"""Weights & Biases: the metric records of one run as a W&B run (optional: `pip install titan-debug[wandb]`).

One W&B run per training run, written by one process (titan-train: rank 0), with the resolved config
attached. Its W&B id is the caller's run id and it resumes with "allow", so a training run that restarts
into the same dump folder continues the same W&B run (W&B drops rows whose step is not above the last one
it has, e.g. the steps a resumed run repeats after its last checkpoint). Scalars are named as in
TensorBoard (nested mappings flattened with ``/``). ``mode="offline"`` writes under ``<dir>/wandb`` without
a network or an account; upload later with ``wandb sync``. W&B's background service writes the run's
file asynchronously: it is complete once the process exits (or after ``wandb.teardown()``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from titan_debug.tensorboard import scalars

MODES = ("online", "offline")


class WandbWriter:
    """Writes records as W&B scalars at their step."""

    def __init__(
        self,
        directory: str | Path,
        *,
        project: str,
        name: str,
        run_id: str | None = None,
        config: Mapping[str, Any] | None = None,
        mode: str = "online",
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}; use one of {', '.join(MODES)}")
        wandb = import_wandb()
        Path(directory).mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=project,
            name=name,
            id=run_id,
            resume="allow" if run_id else None,
            config=dict(config or {}),
            dir=str(directory),
            mode=mode,
        )

    def write(self, step: int, record: Mapping[str, Any]) -> None:
        values = dict(scalars(record))
        if values:
            self._run.log(values, step=int(step))

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


def import_wandb():
    """The wandb module, or an ImportError that says how to install it."""
    try:
        import wandb
    except ImportError as e:
        raise ImportError("Weights & Biases logging needs the wandb package: pip install 'titan-debug[wandb]'") from e
    return wandb
