"""Every use the simulator makes of torch's private APIs and internal behaviour, each named here with the torch
behaviour it relies on; tests/test_torch_internals.py checks each one, so a torch upgrade that changes one fails
there, by name, instead of deep inside a dry run.

- The fake process group: `FakeStore` and the "fake" backend from torch.testing._internal.
- FakeTensorMode: `unset_fake_temporarily`, `FakeTensor.constant`, the ops scalar reads dispatch to (`SCALAR_READS`);
  pytree's `tree_leaves` (an op's tensor arguments).
- Pipeline metadata exchange: `PipelineStage._recv_meta` / `_send_meta` and the `_StageForwardMeta` /
  `_StageBackwardMeta` they carry, and the schedule's `_warmup_p2p` vote between static and dynamic metadata
  inference, with `InferenceMode` (`pipeline_meta_exchange`).
- `torch.utils.swap_tensors` refusing weakly referenced tensors, FakeTensorMode's weak caches holding such refs,
  found with `gc.get_referrers` (`swap_tensors_dropping_weak_caches`, `drop_weak_cache_entries`).
- FSDP2's communication streams: `FSDPCommContext.lazy_init` creates them, FSDP enters them with
  `device_handle.stream(s)` (`fsdp_comm_streams`).
"""

import contextlib
import gc
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from unittest import mock

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPCommContext
from torch.distributed.pipelining import PipelineStage
from torch.testing._internal.distributed.fake_pg import FakeStore  # importing it registers the "fake" backend
from torch.utils._pytree import tree_leaves  # the leaves of nested tuples, lists and dicts: an op's arguments
from torch.utils.weak import WeakIdRef

__all__ = [
    "FSDP_COMM_STREAMS",
    "SCALAR_READS",
    "FakeTensor",
    "FakeTensorMode",
    "drop_weak_cache_entries",
    "fake_constant",
    "fsdp_comm_streams",
    "init_fake_process_group",
    "pipeline_meta_exchange",
    "swap_tensors_dropping_weak_caches",
    "tree_leaves",
    "unset_fake_temporarily",  # inside it, a FakeTensorMode lets ops run for real (the mesh's rank tables)
]

# What a scalar read of a tensor dispatches to: `.item()`, `bool(t)`, `int(t)`, `float(t)` and `torch.is_nonzero`
# reach `_local_scalar_dense` (`is_nonzero` decomposes to it): a mode that answers these answers every read.
SCALAR_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default)

# FSDPCommContext's stream attributes, set by lazy_init; less "_stream", the names `on_stream` is given.
FSDP_COMM_STREAMS = ("all_gather_copy_in_stream", "all_gather_stream", "reduce_scatter_stream", "all_reduce_stream")


def init_fake_process_group(rank: int, world_size: int) -> None:
    """This process becomes `rank` of `world_size` on torch's test-only "fake" backend: collectives return at
    once, moving no data. The backend is registered by importing torch.testing._internal's fake_pg, whose
    `FakeStore` is the store it expects (no rendezvous)."""
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)


def fake_constant(tensor: FakeTensor) -> torch.Tensor | None:
    """The real value FakeTensorMode kept for `tensor` (`FakeTensor.constant`: set for small tensors made from
    Python constants, e.g. `torch.tensor(3.0)`), else None."""
    return tensor.constant


@contextlib.contextmanager
def pipeline_meta_exchange(hidden_states: Callable[[PipelineStage], tuple[torch.Tensor, ...]]) -> Iterator[None]:
    """Inside: pipeline stages whose neighbours live on other (simulated) ranks exchange no metadata.

    A PipelineStage infers its input and output-grad metadata at its first step by receiving a pickled
    `_StageForwardMeta` / `_StageBackwardMeta` from the neighbouring rank (`_recv_meta(src_stage)`, sent with
    `_send_meta(meta, dst_stage)`); fake collectives carry no objects. So `_send_meta` sends nothing, and
    `_recv_meta` answers, from the previous stage, the metadata of `hidden_states(stage)` (the activations
    between stages) and, from the next stage, as output grads the metadata of the stage's own outputs."""

    # Imported only when a pipeline is simulated: these are newer than the rest of what is used here (torch 2.13
    # has them, 2.11 does not), so a dry run without PP also runs on older torch (the GPU check's machine).
    from torch.distributed.pipelining._utils import (
        InferenceMode,
        _StageBackwardMeta,
        _StageForwardMeta,
        extract_tensor_metas,
    )
    from torch.distributed.pipelining.schedules import _PipelineSchedule

    def recv_meta(self, src_stage: int):
        if src_stage < self.stage_index:
            return _StageForwardMeta(forward_metas=extract_tensor_metas(hidden_states(self)))
        return _StageBackwardMeta(backward_metas=self._stage_meta.outputs)

    def infer_dynamically(self, stages, has_backward: bool, p2p_done: bool) -> None:
        # Before its first step a schedule votes over the group between static metadata (given to the stage's
        # constructor; we give none) and dynamic inference. Over a fake group torch 2.13's vote reads zeros and
        # picks dynamic; 2.14 refuses dynamic inference there. The simulated exchange above makes it work.
        for stage in stages:
            stage._inference_mode = InferenceMode.DYNAMIC

    with (
        mock.patch.object(PipelineStage, "_recv_meta", recv_meta),
        mock.patch.object(PipelineStage, "_send_meta", lambda self, meta, dst_stage: None),
        mock.patch.object(_PipelineSchedule, "_warmup_p2p", infer_dynamically),
    ):
        yield


def _drop_entry(table: dict, ref) -> bool:
    """Remove `ref` from `table` if it is an entry there (a WeakValueDictionary's value: a `weakref.KeyedRef`;
    a WeakIdKeyDictionary's key: a `WeakIdRef`); whether it was."""
    if isinstance(ref, weakref.KeyedRef) and table.get(ref.key) is ref:
        del table[ref.key]
        return True
    if isinstance(ref, WeakIdRef) and ref in table and any(key is ref for key in table):
        del table[ref]
        return True
    return False


def drop_weak_cache_entries(refs: list, tables: list[dict] | None = None) -> None:
    """Remove `refs` that are entries of weak dictionaries from those dictionaries: the refs die with their
    entries. The dictionaries are found as the refs' referrers (`gc.get_referrers`: a weak dictionary's plain
    `dict`), in one walk of the heap for all of `refs`; `tables`, where given, holds the dictionaries found by
    earlier calls: looked in first, and what this call's walk finds is added. A walk costs ~30 ms in a dry run's
    process; one per swapped parameter was a fifth of a pipeline stage's simulation, and the entries are in the
    same few caches each time."""
    tables = [] if tables is None else tables
    refs = [ref for ref in refs if not any(_drop_entry(table, ref) for table in tables)]
    if not refs:
        return
    for table in gc.get_referrers(*refs):
        if isinstance(table, dict) and any([_drop_entry(table, ref) for ref in refs]):  # a list: every ref tried
            tables.append(table)


@contextlib.contextmanager
def swap_tensors_dropping_weak_caches() -> Iterator[None]:
    """Inside: `torch.utils.swap_tensors` first drops the weak-cache entries referring to either tensor.

    `Module.to_empty` (`Module._apply`) swaps a fake parameter for its materialized copy with
    `torch.utils.swap_tensors`, looked up at call time, which refuses a tensor something holds a weak
    reference to; FakeTensorMode's converter memo (a WeakValueDictionary) holds one to a fake Parameter made on
    a miss of FakeTensorMode's dispatch cache (the first of its shape in the process, at least), and its meta
    describer's tensor ids (a WeakIdKeyDictionary) one to a parameter it described."""
    original = torch.utils.swap_tensors
    tables: list[dict] = []  # the caches found so far: the same few each time

    def swap_tensors(t1, t2):
        drop_weak_cache_entries([*weakref.getweakrefs(t1), *weakref.getweakrefs(t2)], tables)
        return original(t1, t2)

    with mock.patch.object(torch.utils, "swap_tensors", swap_tensors):
        yield


@contextlib.contextmanager
def fsdp_comm_streams(device_type: str, on_stream: Callable[[str], AbstractContextManager]) -> Iterator[None]:
    """Inside: whatever FSDP2 runs on one of its communication streams also runs inside `on_stream(name)`
    (name: "all_gather_copy_in", "all_gather", "reduce_scatter", "all_reduce").

    FSDP2 creates its streams in `FSDPCommContext.lazy_init(device)` (the attributes `FSDP_COMM_STREAMS`) and
    switches to one with `device_handle.stream(s)`, `device_handle` being `torch.<device_type>`: both are
    wrapped, and a stream FSDP did not create enters no `on_stream`."""
    device_module = getattr(torch, device_type)
    streams: dict[int, tuple[object, str]] = {}  # id -> (the stream, kept alive so the id stays its own; name)
    original_stream, original_lazy_init = device_module.stream, FSDPCommContext.lazy_init

    def lazy_init(comm, device):
        original_lazy_init(comm, device)
        for attribute in FSDP_COMM_STREAMS:
            stream = getattr(comm, attribute)
            streams[id(stream)] = (stream, attribute.removesuffix("_stream"))

    @contextlib.contextmanager
    def stream_context(stream):
        known = streams.get(id(stream))
        with original_stream(stream), on_stream(known[1]) if known else contextlib.nullcontext():
            yield

    with (
        mock.patch.object(device_module, "stream", stream_context),
        mock.patch.object(FSDPCommContext, "lazy_init", lazy_init),
    ):
        yield
