"""The torch internals the dry run relies on (titan_train/simulate/torch_internals.py), one test each: a torch
upgrade that changes one fails here, naming the behaviour, instead of somewhere inside a simulated step.
Small modules on CPU; a process group, where one is needed, is torch's fake one, destroyed after."""

import contextlib
import gc
import inspect
import weakref
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPCommContext
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining._utils import _StageBackwardMeta, _StageForwardMeta, extract_tensor_metas
from torch.utils.weak import WeakIdKeyDictionary

from titan_train.simulate import torch_internals as ti


@contextlib.contextmanager
def _fake_group(rank: int, world_size: int):
    assert not dist.is_initialized()
    ti.init_fake_process_group(rank, world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


# The fake process group


def test_fake_process_group_initializes_and_its_collectives_move_no_data():
    with _fake_group(3, 8):
        assert (dist.get_backend(), dist.get_rank(), dist.get_world_size()) == ("fake", 3, 8)
        tensor = torch.ones(4)
        dist.all_reduce(tensor)  # returns at once: no peer to wait for
        assert torch.equal(tensor, torch.ones(4))


# FakeTensorMode


def test_unset_fake_temporarily_runs_ops_for_real_inside_a_fake_mode():
    with ti.FakeTensorMode():
        assert isinstance(torch.empty(2), ti.FakeTensor)
        with ti.unset_fake_temporarily():
            real = torch.arange(3)
    assert not isinstance(real, ti.FakeTensor) and real.sum().item() == 3


def test_fake_mode_keeps_the_value_of_a_small_constant_tensor():
    with ti.FakeTensorMode():
        constant, data = torch.tensor(3.0), torch.empty(3)
    assert ti.fake_constant(constant).item() == 3.0 and ti.fake_constant(data) is None


class _AnsweringScalarReads(ti.FakeTensorMode):
    """What the dry run's mode does: a subclass answering SCALAR_READS in __torch_dispatch__."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in ti.SCALAR_READS:
            return 7 if func is torch.ops.aten._local_scalar_dense.default else True
        return super().__torch_dispatch__(func, types, args, kwargs)


def test_every_scalar_read_of_a_fake_tensor_dispatches_to_a_scalar_read_op():
    with _AnsweringScalarReads():
        number, flag = torch.empty(()), torch.empty((), dtype=torch.bool)
        assert (number.item(), int(number), float(number)) == (7, 7, 7.0)
        assert bool(flag) and torch.is_nonzero(flag)
        assert (1 if flag else 0) == 1


def test_tree_leaves_flattens_nested_arguments():
    a, b, c = torch.ones(1), torch.ones(2), torch.ones(3)
    assert ti.tree_leaves(((a, [1, {"x": b}]), {"y": c})) == [a, 1, b, c]


# Pipeline metadata exchange


def test_pipeline_stage_meta_methods_have_the_patched_signatures():
    assert list(inspect.signature(PipelineStage._recv_meta).parameters) == ["self", "src_stage"]
    assert list(inspect.signature(PipelineStage._send_meta).parameters) == ["self", "meta", "dst_stage"]
    metas = extract_tensor_metas((torch.empty(2, 4),))
    assert _StageForwardMeta(forward_metas=metas).forward_metas == metas
    assert _StageBackwardMeta(backward_metas=metas).backward_metas == metas


def test_the_schedule_warm_up_sets_each_stage_inference_mode_through_the_patched_method():
    """`pipeline_meta_exchange` replaces `_PipelineSchedule._warmup_p2p` (the static/dynamic vote): it must still
    be what a schedule calls before its first step, with these parameters, and `_inference_mode` what it sets."""
    from torch.distributed.pipelining._utils import InferenceMode
    from torch.distributed.pipelining.schedules import _PipelineSchedule

    assert list(inspect.signature(_PipelineSchedule._warmup_p2p).parameters) == [
        "self",
        "stages",
        "has_backward",
        "p2p_done",
    ]
    assert "self._warmup_p2p(stages, self._has_backward, p2p_done)" in inspect.getsource(_PipelineSchedule)
    with _fake_group(0, 2), ti.pipeline_meta_exchange(lambda stage: (torch.empty(2, 4),)):
        stage = PipelineStage(nn.Linear(4, 6), stage_index=0, num_stages=2, device=torch.device("cpu"))
        _PipelineSchedule._warmup_p2p(None, [stage], True, False)
    assert stage._inference_mode is InferenceMode.DYNAMIC


def test_a_middle_stage_exchanges_its_metadata_only_through_recv_and_send_meta():
    """Stage 1 of 3 on rank 1 of 3: both neighbours on other ranks. Its metadata inference receives the
    hidden states from stage 0 and output grads from stage 2 by `_recv_meta` and sends by `_send_meta` alone."""
    sent = []
    with (
        _fake_group(1, 3),
        ti.pipeline_meta_exchange(lambda stage: (torch.empty(2, 4),)),
        mock.patch.object(
            PipelineStage, "_send_meta", lambda self, meta, dst_stage: sent.append((type(meta), dst_stage))
        ),
    ):
        stage = PipelineStage(nn.Linear(4, 6), stage_index=1, num_stages=3, device=torch.device("cpu"))
        stage._forward_metadata_inference(None, has_backward=True)
        stage._backward_metadata_inference()
    assert sent == [(_StageForwardMeta, 2), (_StageBackwardMeta, 0)]
    meta = stage._stage_meta
    assert meta.inputs[0].shape == (2, 4) and meta.outputs[0].shape == (2, 6)
    assert meta.output_grads == meta.outputs


# swap_tensors and FakeTensorMode's weak caches


def test_swap_tensors_still_refuses_a_weakly_referenced_tensor():
    tensor = torch.zeros(2)
    ref = weakref.ref(tensor)
    with pytest.raises(RuntimeError, match="weakref"):
        torch.utils.swap_tensors(tensor, torch.ones(2))
    assert ref() is tensor


def test_the_fake_converter_memo_holds_a_keyed_weak_ref_to_a_new_fake_parameter():
    ti.FakeTensorMode.cache_clear()  # a fake Parameter made from FakeTensorMode's dispatch cache has no memo entry
    mode = ti.FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        weight = nn.Linear(2, 2).weight
    memo = mode.fake_tensor_converter.tensor_memo
    assert isinstance(memo, weakref.WeakValueDictionary)
    (ref,) = weakref.getweakrefs(weight)
    assert isinstance(ref, weakref.KeyedRef) and memo.get(ref.key) is weight
    assert any(table is memo.data for table in gc.get_referrers(ref))  # how drop_weak_cache_entries finds it


def test_to_empty_of_a_fake_parameter_needs_the_weak_cache_entries_dropped():
    ti.FakeTensorMode.cache_clear()
    with ti.FakeTensorMode(allow_non_fake_inputs=True):
        with pytest.raises(RuntimeError, match="swap"):
            nn.Linear(2, 2).to_empty(device="cpu")
        ti.FakeTensorMode.cache_clear()
        module = nn.Linear(2, 2)
        assert weakref.getweakrefs(module.weight)
        with ti.swap_tensors_dropping_weak_caches():  # Module._apply looks torch.utils.swap_tensors up per call
            module.to_empty(device="cpu")
    assert isinstance(module.weight, nn.Parameter) and module.weight.shape == (2, 2)


def test_drop_weak_cache_entries_removes_weak_value_and_weak_id_key_entries_only():
    tensor = torch.zeros(2)
    values, keys, plain = weakref.WeakValueDictionary(), WeakIdKeyDictionary(), weakref.ref(tensor)
    values["t"], keys[tensor] = tensor, "t"
    ti.drop_weak_cache_entries(weakref.getweakrefs(tensor))
    assert len(values) == 0 and len(keys) == 0
    assert weakref.getweakrefs(tensor) == [plain]  # a ref in no cache stays


def test_the_tables_one_call_found_serve_the_next_without_walking_the_heap(monkeypatch):
    first, second = torch.zeros(2), torch.zeros(2)
    values = weakref.WeakValueDictionary()
    values["first"], values["second"] = first, second
    tables = []
    ti.drop_weak_cache_entries(weakref.getweakrefs(first), tables)
    assert tables == [values.data] and list(values) == ["second"]
    monkeypatch.setattr(ti.gc, "get_referrers", lambda *refs: pytest.fail("walked the heap"))
    ti.drop_weak_cache_entries(weakref.getweakrefs(second), tables)
    assert len(values) == 0


# FSDP2's communication streams


def test_fsdp_comm_context_lazy_init_creates_the_streams_read():
    assert list(inspect.signature(FSDPCommContext.lazy_init).parameters) == ["self", "device"]
    comm = FSDPCommContext()
    comm.lazy_init(torch.device("cpu"))
    streams = [getattr(comm, name) for name in ti.FSDP_COMM_STREAMS]
    assert len({id(s) for s in streams}) == 4 and comm.device_handle is torch.cpu
    # The all-gather uses the copy-in and all-gather streams only when prefetching implicitly.
    assert comm.get_all_gather_streams(False, TrainingState.FORWARD) == tuple(streams[:2])
    assert comm.get_all_gather_streams(True, TrainingState.FORWARD) == (torch.cpu.current_stream(),) * 2


def test_fsdp_enters_its_streams_through_the_device_modules_stream():
    entered, originals = [], (torch.cpu.stream, FSDPCommContext.lazy_init)

    @contextlib.contextmanager
    def on_stream(name):
        entered.append(name)
        yield

    with _fake_group(0, 2), ti.fsdp_comm_streams("cpu", on_stream):
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        for module in (model[0], model[1], model):
            fully_shard(module)
        model(torch.randn(2, 4)).sum().backward()
    # all_reduce: HSDP only
    assert set(entered) == {"all_gather_copy_in", "all_gather", "reduce_scatter"}
    assert (torch.cpu.stream, FSDPCommContext.lazy_init) == originals
