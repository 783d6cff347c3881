"""The bytes of tensor memory that ops allocate while a mode is active, counted until freed: the peak of
a step's tracked allocations, exact and device-independent (it works on the meta device, so a step can be
measured without running it). Views share their storage and are counted once.

    with LiveBytes() as tracker:
        loss = model(inputs).sum(); loss.backward()
    tracker.peak   # the most bytes live at once, not counting what existed before `with`
"""

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # An output sharing an input's storage (a view, an in-place op) allocated nothing.
        inputs = {leaf.untyped_storage()._cdata for leaf in tree_leaves((args, kwargs)) if _has_storage(leaf)}
        for leaf in tree_leaves(out):
            if _has_storage(leaf) and leaf.untyped_storage()._cdata not in inputs:
                self._track(leaf.untyped_storage())
        return out

    def _track(self, storage: torch.UntypedStorage) -> None:
        # _cdata identifies the storage itself (meta storages all have data_ptr 0).
        key, nbytes = storage._cdata, storage.nbytes()
        if key in self._seen or nbytes == 0:
            return
        self._seen.add(key)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key, nbytes)

    def _free(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes


def _has_storage(value) -> bool:
    return isinstance(value, torch.Tensor) and not value.is_sparse
