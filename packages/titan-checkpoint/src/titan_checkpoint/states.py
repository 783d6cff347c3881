"""Stateful wrappers for what a training run checkpoints.

Model and optimizer state go through torch.distributed.checkpoint.state_dict, whose keys are parameter
FQNs whatever the parallel layout (FSDP2, TP, pipeline stages), so a checkpoint written with one layout
loads into another: DCP reshards. State that differs per rank (dataloader position, RNG) goes through
RankLocal, which saves it under the rank's own key instead of letting DCP keep one rank's copy;
DataParallelState does the same for a data-parallel rank's state and, when the data-parallel size changes,
hands every old rank's state to the object so it can re-deal them (a dataloader's position).
"""

from __future__ import annotations

import io
import random
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from titan_checkpoint.errors import CheckpointCorruptError


def _as_list(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (list, tuple)) else [x]


class ModelState:
    """The parameters (and persistent buffers) of a model, or of the model parts of pipeline stages."""

    def __init__(self, model: nn.Module | Sequence[nn.Module]):
        self.parts: list[nn.Module] = _as_list(model)

    def state_dict(self) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for part in self.parts:
            merged.update(get_model_state_dict(part))
        return merged

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for part in self.parts:
            keys = get_model_state_dict(part).keys()
            missing = [k for k in keys if k not in state_dict]
            if missing:
                raise KeyError(f"model state lacks {len(missing)} parameter(s) of this model, e.g. {missing[:3]}")
            set_model_state_dict(part, {k: state_dict[k] for k in keys})


class OptimizerState:
    """Optimizer state keyed by parameter FQN (flattened), for one optimizer per model part."""

    _OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)

    def __init__(self, model: nn.Module | Sequence[nn.Module], optimizer: Any):
        self.parts, self.optimizers = _as_list(model), _as_list(optimizer)
        if len(self.parts) != len(self.optimizers):
            raise ValueError(f"{len(self.parts)} model parts but {len(self.optimizers)} optimizers; need one each")

    def state_dict(self) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for part, optimizer in zip(self.parts, self.optimizers, strict=True):
            merged.update(get_optimizer_state_dict(part, optimizer, options=self._OPTIONS))
        return merged

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for part, optimizer in zip(self.parts, self.optimizers, strict=True):
            set_optimizer_state_dict(part, optimizer, state_dict, options=self._OPTIONS)


class RankLocal:
    """State that differs per rank, saved under `rank<N>` as one opaque blob.

    The blob is `torch.save` bytes, read back with `torch.load(weights_only=True)`: the state may hold
    tensors, numbers, strings, bytes, lists, tuples and dicts. One blob per rank also keeps DCP from
    having to match the nested structure on load (a dataloader's state changes shape as it runs).

    rank: the key; defaults to the global rank. Pass the data-parallel rank for a dataloader, so tensor-
    and pipeline-parallel peers (which read the same data) share one entry. required: if this rank's
    entry is absent on load (the layout changed), fail (True) or keep the current state with a warning.
    """

    def __init__(self, inner: Any, rank: int | None = None, *, required: bool = True):
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.inner, self.rank, self.required = inner, rank, required

    @property
    def key(self) -> str:
        return f"rank{self.rank}"

    def state_dict(self) -> dict[str, bytes]:
        return {self.key: _to_blob(self.inner.state_dict())}

    def load_state_dict(self, state_dict: dict[str, bytes]) -> None:
        self.inner.load_state_dict(_from_blob(state_dict[self.key], self.key))


class DataParallelState:
    """The state of one data-parallel rank (a dataloader's position), resumable on another dp size.

    Saved as RankLocal saves it: one blob under `rank<dp_rank>` (the tensor-, context- and pipeline-parallel
    peers of a dp rank write one entry), so checkpoints of either wrapper load with the other. On load:
      - same dp size as saved: each rank reads only its own entry into `inner.load_state_dict` (exact resume);
      - another dp size: each rank reads every saved entry and calls
        `inner.load_state_dict_resharded(states, dp_rank, dp_world_size)`, where states[i] is what
        `inner.state_dict()` returned on old dp rank i. The inner object decides how to continue (titan-train's
        dataloader deals the documents no old rank consumed over the new ranks). An object without that
        method fails the load, before anything is read, with a message naming the state.
    """

    def __init__(self, inner: Any, dp_rank: int, dp_world_size: int):
        if not 0 <= dp_rank < dp_world_size:
            raise ValueError(f"dp_rank={dp_rank} must be in [0, dp_world_size={dp_world_size})")
        self.inner, self.dp_rank, self.dp_world_size = inner, dp_rank, dp_world_size
        self._saved_world: int | None = None

    @property
    def key(self) -> str:
        return f"rank{self.dp_rank}"

    def state_dict(self) -> dict[str, bytes]:
        return {self.key: _to_blob(self.inner.state_dict())}

    def entries_to_load(self, saved: Iterable[str]) -> list[str]:
        """Which of the checkpoint's entries (`rank<N>` keys) this rank reads: its own when the dp size is
        unchanged, else all of them. Raises ValueError when the entries are not rank0..rank<n-1> or the dp size
        changed and `inner` cannot reshard. Remembers the saved dp size for `load_state_dict`."""
        saved = sorted(saved, key=lambda k: (len(k), k))
        world = len(saved)
        if not saved or saved != [f"rank{i}" for i in range(world)]:
            raise ValueError(
                f"holds entries {saved or 'none'}, expected rank0 .. rank<n-1> (one per data-parallel rank)"
            )
        if world != self.dp_world_size and not hasattr(self.inner, "load_state_dict_resharded"):
            raise ValueError(
                f"was saved by {world} data-parallel ranks and is loaded by {self.dp_world_size}, but "
                f"{type(self.inner).__name__} has no load_state_dict_resharded(states, dp_rank, dp_world_size) "
                f"to re-deal it"
            )
        self._saved_world = world
        return [self.key] if world == self.dp_world_size else saved

    def load_state_dict(self, state_dict: dict[str, bytes]) -> None:
        world = self._saved_world if self._saved_world is not None else len(state_dict)
        self._saved_world = None
        if world == self.dp_world_size:
            self.inner.load_state_dict(_from_blob(state_dict[self.key], self.key))
            return
        states = [_from_blob(state_dict[f"rank{i}"], f"rank{i}") for i in range(world)]
        self.inner.load_state_dict_resharded(states, self.dp_rank, self.dp_world_size)


def _to_blob(state: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _from_blob(blob: bytes, key: str) -> Any:
    try:
        return torch.load(io.BytesIO(blob), weights_only=True)
    except Exception as e:
        raise CheckpointCorruptError(
            f"the saved state of {key} cannot be read with torch.load(weights_only=True) ({type(e).__name__}: {e})"
        ) from e


class RNGState:
    """The random number generators of this process: torch (CPU and accelerator) and Python's `random`.
    (NumPy's is not included: titan-checkpoint does not depend on NumPy.)"""

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.accelerator.is_available():
            device = torch.accelerator.current_accelerator()
            state[device.type] = torch.get_device_module(device).get_rng_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        random.setstate(state["python"])
        if torch.accelerator.is_available():
            device = torch.accelerator.current_accelerator()
            if device.type in state:
                torch.get_device_module(device).set_rng_state(state[device.type])
