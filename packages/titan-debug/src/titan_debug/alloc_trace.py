"""Every storage allocation and free of a piece of code, with the op and phase that caused it.

``AllocationTracker`` is a ``TorchDispatchMode``-based recorder that works the same on real tensors and on
``FakeTensorMode`` tensors, so a training step can be measured without the memory it describes:

    with FakeTensorMode(), AllocationTracker("cpu") as tracker:  # a fake tensor counts on the device it names
        tracker.track_existing(model.parameters(), phase="params")
        with tracker.phase("forward"):
            loss = model(x).sum()
        with tracker.phase("backward"):
            loss.backward()
    print(tracker.peak_active())

What counts, and why:
- A storage counts once, however many views share it, and is recorded when an op first returns it: an
  op output whose storage is neither tracked nor the storage of one of the op's inputs is new memory.
  Views and in-place / ``out=`` ops return storages that are already known, so they allocate nothing.
- Wrapper subclasses (DTensor) are flattened to their inner tensors: the local shard is what a device holds.
- A storage's death is observed with a weakref on its Python ``UntypedStorage`` object. Torch keeps that
  object alive exactly as long as the C++ storage (the same PyObject-preservation scheme tensors use;
  ``t.untyped_storage() is t.untyped_storage()``), so the weakref callback fires when the memory is released,
  like torch's own ``torch.distributed._tools.mem_tracker``.
- ``UntypedStorage.resize_`` bypasses the dispatcher, yet FSDP2 frees and re-allocates its unsharded
  parameters with it (``free_storage`` / ``alloc_storage``), so it is patched while the tracker is active:
  a resize is a free of the old bytes and an allocation of the new ones.
- Collectives are dispatcher ops: a functional all-gather's output is a new storage like any op's, and an
  in-place c10d all-gather writes into a buffer recorded when it was created. ``wait_tensor`` returns its
  input in eager mode but gets a storage of its own under FakeTensorMode (its schema declares no alias), so
  its result is counted as the input's memory, not as new memory.

What it cannot see: memory an op allocates and frees inside its own kernel (workspaces), and storages made
without an op (``torch.UntypedStorage(n)``); allocations by ops that a wrapper subclass runs internally
(e.g. DTensor redistribution temporaries) are seen only through the outputs they leave behind.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

DEFAULT_PHASE = "unlabeled"
DEFAULT_STREAM = "default"
EXISTING_OP = "existing"
RESIZE_OP = "UntypedStorage.resize_"
# Ops that return their input in eager mode but whose schema declares no alias, so FakeTensorMode gives
# the result a storage of its own; the result stands for the input's memory, never for new memory.
_RETURNS_ITS_INPUT = frozenset({"_c10d_functional.wait_tensor.default"})


@dataclass(frozen=True)
class AllocEvent:
    action: str  # "alloc" or "free"
    nbytes: int  # storage bytes as requested (not rounded)
    block: int  # unique per storage allocation, the same for its alloc and free
    op: str  # the op that created the storage; a free repeats it
    phase: str  # the innermost phase label active when the event happened
    stream: str = DEFAULT_STREAM  # the allocator stream pool the storage came from


@dataclass(frozen=True)
class Peak:
    bytes: int
    op: str
    phase: str
    index: int  # index of the event at which the peak is first reached (-1: no event)


@dataclass
class _LiveStorage:
    block: int  # -1 while the storage holds no bytes
    nbytes: int
    op: str
    stream: str
    holders: int = 1  # Python storage objects standing for this memory (see _RETURNS_ITS_INPUT)


def _device_tensors(t: torch.Tensor) -> Iterable[torch.Tensor]:
    """The plain tensors that own memory behind ``t`` (a DTensor's local shard, not the wrapper)."""
    if not is_traceable_wrapper_subclass(t):
        return (t,)  # the common case, without a generator: this runs for every op's every output
    return _wrapped_tensors(t)


def _wrapped_tensors(t: torch.Tensor) -> Iterator[torch.Tensor]:
    pending = [t]
    while pending:
        current = pending.pop()
        if is_traceable_wrapper_subclass(current):
            inner_names, _ = current.__tensor_flatten__()
            pending.extend(
                inner for inner in (getattr(current, name) for name in inner_names) if isinstance(inner, torch.Tensor)
            )
        else:
            yield current


def _storage_of(t: torch.Tensor) -> torch.UntypedStorage | None:
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
        return None


class _Observer(TorchDispatchMode):
    """The dispatch hook; kept apart so the tracker's own API is not mixed with the mode protocol."""

    def __init__(self, tracker: AllocationTracker):
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = _OP_NAMES.get(func)
        if name is None:
            name = _OP_NAMES[func] = str(func)
        self.tracker._record_outputs(name, out, (args, kwargs))
        return out


_OP_NAMES: dict = {}  # op -> its name, as str(op) builds it afresh each time


class AllocationTracker:
    """Records every storage allocation and free on `device_type` while active, for real tensors and for
    FakeTensorMode tensors alike (a TorchDispatchMode; frees observed when the storage dies)."""

    def __init__(self, device_type: str | None = None):
        self.device_type = device_type
        self.events: list[AllocEvent] = []
        self._live: dict[int, _LiveStorage] = {}  # id(UntypedStorage) -> what it holds now
        self._weakrefs: dict[int, weakref.ref] = {}  # keeps each death callback registered
        self._next_block = 0
        self._phases: list[str] = []
        self._streams: list[str] = []
        self._active = False
        self._current = 0
        self._peak = Peak(0, "", DEFAULT_PHASE, -1)
        self._observer: _Observer | None = None
        self._original_resize = None

    # --- context -----------------------------------------------------------------------------------------

    def __enter__(self) -> AllocationTracker:
        if self._active:
            raise RuntimeError("AllocationTracker is already active; it is not reentrant")
        self._active = True
        self._patch_resize()
        self._observer = _Observer(self)
        self._observer.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._observer.__exit__(*exc)
        finally:
            self._observer = None
            self._restore_resize()
            self._active = False

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._phases.append(name)
        try:
            yield
        finally:
            self._phases.pop()

    @contextlib.contextmanager
    def stream(self, name: str) -> Iterator[None]:
        self._streams.append(name)
        try:
            yield
        finally:
            self._streams.pop()

    def track_existing(self, tensors: Iterable[torch.Tensor], phase: str) -> None:
        """Record tensors made before the tracker started (e.g. parameters) as allocated now, in `phase`."""
        with self.phase(phase):
            for tensor in tensors:
                for inner in _device_tensors(tensor):
                    storage = _storage_of(inner)
                    if storage is not None and self._counts(inner) and id(storage) not in self._live:
                        self._start_tracking(storage, EXISTING_OP)

    # --- results -----------------------------------------------------------------------------------------

    def active_bytes(self) -> int:
        return self._current

    def peak_active(self) -> Peak:
        return self._peak

    def bytes_by_phase_at_peak(self) -> dict[str, int]:
        """Live bytes at the peak, grouped by the phase that allocated them."""
        alive: dict[int, AllocEvent] = {}
        for event in self.events[: self._peak.index + 1]:
            if event.action == "alloc":
                alive[event.block] = event
            else:
                alive.pop(event.block, None)
        by_phase: dict[str, int] = {}
        for event in alive.values():
            by_phase[event.phase] = by_phase.get(event.phase, 0) + event.nbytes
        return by_phase

    # --- recording ---------------------------------------------------------------------------------------

    def current_phase(self) -> str:
        return self._phases[-1] if self._phases else DEFAULT_PHASE

    def current_stream(self) -> str:
        return self._streams[-1] if self._streams else DEFAULT_STREAM

    def _counts(self, t: torch.Tensor) -> bool:
        device = t.device.type  # a FakeTensor reports the device it stands for; its storage says "meta"
        return device != "meta" if self.device_type is None else device == self.device_type

    def _counts_storage(self, storage: torch.UntypedStorage) -> bool:
        """For a storage met without its tensor: a fake tensor's storage is on "meta" whatever it stands for."""
        if storage.device.type == "meta":
            return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None
        return self.device_type is None or storage.device.type == self.device_type

    def _record_outputs(self, op: str, out, inputs) -> None:
        input_storage_ids = None  # computed only when an unknown output storage needs the aliasing check
        for leaf in (out,) if isinstance(out, torch.Tensor) else tree_leaves(out):
            if not isinstance(leaf, torch.Tensor):
                continue
            for inner in _device_tensors(leaf):
                storage = _storage_of(inner)
                if storage is None or id(storage) in self._live or not self._counts(inner):
                    continue
                if op in _RETURNS_ITS_INPUT:
                    self._alias_input(storage, inputs)
                    continue
                if input_storage_ids is None:
                    input_storage_ids = self._storage_ids(inputs)
                if id(storage) not in input_storage_ids:  # else: a view or in-place result of an untracked input
                    self._start_tracking(storage, op)

    def _alias_input(self, storage: torch.UntypedStorage, inputs) -> None:
        for leaf in tree_leaves(inputs):
            if isinstance(leaf, torch.Tensor):
                for inner in _device_tensors(leaf):
                    source = _storage_of(inner)
                    live = self._live.get(id(source)) if source is not None else None
                    if live is not None:
                        live.holders += 1
                        self._watch(storage, live)
                        return

    @staticmethod
    def _storage_ids(tree) -> set[int]:
        ids = set()
        for leaf in tree_leaves(tree):
            if isinstance(leaf, torch.Tensor):
                for inner in _device_tensors(leaf):
                    storage = _storage_of(inner)
                    if storage is not None:
                        ids.add(id(storage))
        return ids

    def _start_tracking(self, storage: torch.UntypedStorage, op: str) -> None:
        live = _LiveStorage(-1, 0, op, self.current_stream())
        self._watch(storage, live)
        self._set_size(live, storage.nbytes())

    def _watch(self, storage: torch.UntypedStorage, live: _LiveStorage) -> None:
        key = id(storage)
        self._live[key] = live
        self._weakrefs[key] = weakref.ref(storage, functools.partial(self._on_storage_death, key))

    def _set_size(self, live: _LiveStorage, nbytes: int) -> None:
        """Move a storage to `nbytes`: a new block first, then the old one freed, as a reallocation does."""
        old_block, old_nbytes = live.block, live.nbytes
        if nbytes > 0:
            live.block = self._next_block
            self._next_block += 1
            live.nbytes = nbytes
            self._append(AllocEvent("alloc", nbytes, live.block, live.op, self.current_phase(), live.stream))
        else:
            live.block, live.nbytes = -1, 0
        if old_nbytes > 0:
            self._append(AllocEvent("free", old_nbytes, old_block, live.op, self.current_phase(), live.stream))

    def _append(self, event: AllocEvent) -> None:
        self.events.append(event)
        self._current += event.nbytes if event.action == "alloc" else -event.nbytes
        if self._current > self._peak.bytes:
            self._peak = Peak(self._current, event.op, event.phase, len(self.events) - 1)

    def _on_storage_death(self, key: int, _ref: weakref.ref) -> None:
        live = self._live.pop(key, None)
        self._weakrefs.pop(key, None)
        if live is None:
            return
        live.holders -= 1
        if live.holders == 0 and live.nbytes > 0 and self._active:
            self._append(AllocEvent("free", live.nbytes, live.block, live.op, self.current_phase(), live.stream))

    # FSDP2 frees and re-allocates unsharded parameters by resizing their storage; the dispatcher never sees it.
    def _patch_resize(self) -> None:
        original = torch.UntypedStorage.resize_
        tracker = self

        @functools.wraps(original)
        def resize_(storage, size):
            result = original(storage, size)
            live = tracker._live.get(id(storage))
            if live is None:
                # Made before the tracker started: its old bytes were never counted, so only growth from
                # empty (FSDP's unsharded parameter coming back) is new memory.
                if storage.nbytes() > 0 and tracker._counts_storage(storage):
                    tracker._start_tracking(storage, RESIZE_OP)
            elif storage.nbytes() != live.nbytes:
                if live.nbytes == 0:  # re-allocated: it comes from the resize, on the stream in use now
                    live.op, live.stream = RESIZE_OP, tracker.current_stream()
                tracker._set_size(live, storage.nbytes())
            return result

        self._original_resize = original
        torch.UntypedStorage.resize_ = resize_

    def _restore_resize(self) -> None:
        if self._original_resize is not None:
            torch.UntypedStorage.resize_ = self._original_resize
            self._original_resize = None
