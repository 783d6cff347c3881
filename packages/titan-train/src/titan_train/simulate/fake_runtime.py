"""One rank of an N-rank run, simulated in this process: torch's fake process group (collectives return at
once, moving no data) and FakeTensorMode (tensors with shapes, dtypes and storage sizes but no data).

What torch cannot run that way, and how each is bridged (each a documented torch limitation, none a copy of
Titan's own logic):
- DeviceMesh computes rank lists from tensors: the mesh is built with fake tensors off, from real (tiny) ones,
  and ops whose inputs are all real run for real.
- A scalar read (`.item()`, `bool(t)`) has no data to read: it reads the tensor's constant where FakeTensorMode
  kept one, else False / 0 / 1.0 (so a loss and a grad norm read as finite).
- Pipeline stages exchange shape metadata by pickled P2P objects, which fake collectives cannot carry: a stage
  receives the hidden states [micro-batch, local sequence, dim] from its predecessor, and as output grads the
  metadata of its own outputs.
- `Module.to_empty` swaps a fake parameter for its materialized copy (`torch.utils.swap_tensors`), which
  refuses a tensor something holds a weak reference to, and FakeTensorMode's converter memos (caches: weak
  value dictionaries) hold one to every fake Parameter they make: those cache entries are dropped before the
  swap. FSDP and TP replace parameters with DTensors first, so only unsharded parameters meet this (one rank,
  a pipeline stage without FSDP).
"""

import contextlib
import gc
import weakref
from collections.abc import Iterator
from unittest import mock

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining._utils import _StageBackwardMeta, _StageForwardMeta, extract_tensor_metas
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdRef

from titan_parallel.mesh.parallel_dims import ParallelDims

_SCALAR_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default)


def _scalar_of(tensor: FakeTensor):
    if tensor.constant is not None:
        return tensor.constant.item()
    # bool: e.g. "any value out of range?" loops stop; float: a finite loss and grad norm, a non-zero scale.
    return False if tensor.dtype == torch.bool else (1.0 if tensor.dtype.is_floating_point else 0)


class _DatalessFakeTensorMode(FakeTensorMode):
    """FakeTensorMode, except: scalar reads of fake tensors read `_scalar_of`, and ops on real tensors only
    (the mesh's rank tables) run for real. One mode, not a second one stacked on it: it sees every op."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SCALAR_READS and isinstance(args[0], FakeTensor):
            value = _scalar_of(args[0])
            return value if func is torch.ops.aten._local_scalar_dense.default else bool(value)
        if not any(isinstance(a, FakeTensor) for a in args):  # else (most ops) it is fake work at once
            tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
            if tensors and not any(isinstance(t, FakeTensor) or t.is_meta for t in tensors):
                with unset_fake_temporarily():
                    return func(*args, **kwargs)
        return super().__torch_dispatch__(func, types, args, kwargs)


def _build_mesh_with_real_tensors(original):
    def build_mesh(self, device_type):
        with unset_fake_temporarily():
            return original(self, device_type)

    return build_mesh


def _swap_dropping_cached_refs(original):
    def swap_tensors(t1, t2):
        for tensor in (t1, t2):
            _drop_cache_entries(weakref.getweakrefs(tensor))
        return original(t1, t2)

    return swap_tensors


def _drop_cache_entries(refs: list) -> None:
    """Remove `refs` that are entries of weak dictionaries (a WeakValueDictionary's value, a
    WeakIdKeyDictionary's key) from those dictionaries: the refs die with their entries."""
    for ref in refs:
        for table in gc.get_referrers(ref):
            if not isinstance(table, dict):
                continue
            if isinstance(ref, weakref.KeyedRef) and table.get(ref.key) is ref:
                del table[ref.key]
            elif isinstance(ref, WeakIdRef) and any(key is ref for key in table):
                del table[ref]


def _stage_meta_exchange(hidden_meta):
    """`_recv_meta` for a stage whose neighbours live on other (simulated) ranks; `_send_meta` sends nothing."""

    def recv_meta(self, src_stage: int):
        if src_stage < self.stage_index:
            return _StageForwardMeta(forward_metas=hidden_meta(self))
        return _StageBackwardMeta(backward_metas=self._stage_meta.outputs)

    return recv_meta


@contextlib.contextmanager
def fake_rank(rank: int, world_size: int, hidden_shape, hidden_dtype: torch.dtype) -> Iterator[FakeTensorMode]:
    """Inside: this process is `rank` of `world_size` on the fake backend, every new tensor fake.
    `hidden_shape`: the activations between pipeline stages (micro-batch, local sequence, dim)."""
    if dist.is_initialized():
        raise RuntimeError("a dry run needs a process without a process group (it creates a fake one)")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    fake_mode = _DatalessFakeTensorMode(allow_non_fake_inputs=True)

    def hidden_meta(stage):
        with fake_mode:
            return extract_tensor_metas((torch.empty(hidden_shape, dtype=hidden_dtype),))

    try:
        with (
            mock.patch.object(ParallelDims, "build_mesh", _build_mesh_with_real_tensors(ParallelDims.build_mesh)),
            mock.patch.object(PipelineStage, "_recv_meta", _stage_meta_exchange(hidden_meta)),
            mock.patch.object(PipelineStage, "_send_meta", lambda self, meta, dst_stage: None),
            mock.patch.object(torch.utils, "swap_tensors", _swap_dropping_cached_refs(torch.utils.swap_tensors)),
            fake_mode,
        ):
            yield fake_mode
    finally:
        dist.destroy_process_group()
