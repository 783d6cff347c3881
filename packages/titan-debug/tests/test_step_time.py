"""The step-time model on cases computed by hand: a matmul, a memory-bound op, collectives within and across
nodes, an FSDP prefetch that hides a gather and a consumed-at-once collective that does not, compile's fusion;
and the op trace's FLOPs, bytes and collectives on real tensors and a fake process group."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.testing._internal.distributed.fake_pg import FakeStore

from titan_debug import pipeline_time, step_time
from titan_debug.devices import DEVICES, DeviceSpec, get_device
from titan_debug.op_trace import Collective, OpTrace, TracedOp
from titan_debug.step_time import LINK_EFFICIENCY, MATMUL_EFFICIENCY, MEMORY_EFFICIENCY, predict

# Round figures, so every expected time below is arithmetic on the page.
DEVICE = DeviceSpec(
    name="round",
    bf16_flops=1e12,
    fp8_flops=2e12,
    tf32_flops=5e11,
    fp32_flops=1e11,
    memory_bandwidth=1e9,
    intra_node_bandwidth=1e8,
    inter_node_bandwidth=1e7,
    gpus_per_node=4,
    memory_gib=1,
    source="test",
)


@pytest.fixture(autouse=True)
def no_host_overhead(monkeypatch):
    """The cases below time the device alone; test_a_launch_bound_step_waits_for_the_cpu sets it back."""
    monkeypatch.setattr(step_time, "HOST_SECONDS_PER_OP", 0.0)


def traced(fn, *args):
    with OpTrace() as trace:
        fn(*args)
    return [op for op in trace.ops if op.nbytes or op.flops or op.collective]


def test_a_storage_keeps_its_own_key_while_freed_ones_make_room_for_new_ones():
    # Each step writes a new tensor and frees the one before: CPython reuses the freed storage's id at once. A
    # new storage must still get a key no live one holds, or the time model sees a dependency that is not there.
    with OpTrace() as trace:
        x = torch.ones(4)
        for step in range(64):
            x = x + step
    written = [key for op in trace.ops for key, _ in op.writes]
    assert len(written) == 65 and len(set(written)) == 65


def test_a_device_query_is_recorded_as_the_general_path_records_it(monkeypatch):
    """A fake tensor's device is asked through the dispatcher (here by autograd's engine): OpTrace records
    those queries on a short path, which must record what `_trace` would, op for op."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from titan_debug import op_trace

    def step():
        with FakeTensorMode():
            w = torch.randn(8, 8, requires_grad=True)
            (torch.randn(4, 8, dtype=torch.bfloat16) @ w.bfloat16()).float().sum().backward()

    general = []
    traced_generally = op_trace.OpTrace._trace

    def counting(self, func, *rest):
        general.append(str(func))
        return traced_generally(self, func, *rest)

    monkeypatch.setattr(op_trace.OpTrace, "_trace", counting)
    with OpTrace() as short:
        step()
    queries = [op for op in short.ops if op.name == "prim.device.default"]
    assert queries and "prim.device.default" not in general  # the short path taken
    monkeypatch.setattr(op_trace, "_DEVICE_QUERY", None)
    with OpTrace() as long:
        step()
    assert short.ops == long.ops


def test_a_bf16_matmul_is_timed_at_the_bf16_rate_or_by_its_bytes():
    a, b = torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(32, 16, dtype=torch.bfloat16)
    (op,) = traced(torch.mm, a, b)
    assert op.flops == 2 * 64 * 32 * 16
    assert op.nbytes == (64 * 32 + 32 * 16 + 64 * 16) * 2
    assert op.dtype == torch.bfloat16
    compute = 2 * 64 * 32 * 16 / (1e12 * MATMUL_EFFICIENCY)
    memory = (64 * 32 + 32 * 16 + 64 * 16) * 2 / (1e9 * MEMORY_EFFICIENCY)
    assert step_time.op_seconds(op, DEVICE) == pytest.approx(max(compute, memory))
    fast_memory = DEVICE.replace(memory_bandwidth=1e15)
    assert step_time.op_seconds(op, fast_memory) == pytest.approx(compute)


def test_a_bf16_product_accumulated_into_float32_is_timed_at_the_bf16_rate():
    """`addmm(total, a, b, out_dtype=float32)` (the chunked loss's weight gradient on CUDA) multiplies bf16
    operands: the float32 `self` it adds to does not make it a float32 matmul. Fake tensors: CPU has no kernel."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        total = torch.zeros(64, 16)
        a, b = torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(32, 16, dtype=torch.bfloat16)
        (op,) = traced(lambda: torch.addmm(total, a, b, out_dtype=torch.float32, out=total))
    assert (op.flops, op.dtype) == (2 * 64 * 32 * 16, torch.bfloat16)


def test_a_float8_matmul_runs_at_the_float8_rate_where_the_device_has_one():
    op = TracedOp("aten.mm.default", "", "default", 10**12, 0, torch.float8_e4m3fn, (), ())
    assert step_time.op_seconds(op, DEVICE) == pytest.approx(1e12 / (2e12 * MATMUL_EFFICIENCY))
    assert step_time.op_seconds(op, DEVICE.replace(fp8_flops=None)) == pytest.approx(1 / MATMUL_EFFICIENCY)


def test_a_memory_bound_op_is_timed_by_its_bytes():
    x, y = torch.randn(1000), torch.randn(1000)
    (op,) = traced(torch.add, x, y)
    assert (op.flops, op.nbytes) == (0, 3 * 1000 * 4)
    assert step_time.op_seconds(op, DEVICE) == pytest.approx(12000 / (1e9 * MEMORY_EFFICIENCY))


def test_views_and_empty_tensors_move_nothing():
    x = torch.randn(8, 8)
    assert traced(lambda: (x.view(64), x.t(), torch.empty(100), x[2:])) == []


def test_causal_attention_counts_half_of_the_full_attention():
    q = torch.randn(2, 4, 32, 8)
    (full,) = traced(F.scaled_dot_product_attention, q, q, q)
    (causal,) = traced(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True))
    assert full.flops == 4 * 2 * 4 * 32 * 32 * 8  # Q·Kᵀ and P·V, 2 FLOPs per multiply-add
    assert causal.flops == full.flops // 2


def test_collectives_within_a_node_use_nvlink_and_across_nodes_the_nic():
    within = Collective("all_gather", 4_000_000, (0, 1, 2, 3))
    across = Collective("all_gather", 4_000_000, (0, 4))
    assert step_time.collective_seconds(within, DEVICE) == pytest.approx(3 / 4 * 4e6 / (1e8 * LINK_EFFICIENCY))
    assert step_time.collective_seconds(across, DEVICE) == pytest.approx(1 / 2 * 4e6 / (1e7 * LINK_EFFICIENCY))
    all_reduce = Collective("all_reduce", 4_000_000, (0, 1, 2, 3))
    assert step_time.collective_seconds(all_reduce, DEVICE) == pytest.approx(
        2 * step_time.collective_seconds(within, DEVICE)
    )
    assert step_time.collective_seconds(Collective("all_reduce", 10**9, (3,)), DEVICE) == 0


def _compute(seconds: float, reads=(), writes=(), phase="forward") -> TracedOp:
    """A memory-bound op on the default stream that takes `seconds` on DEVICE."""
    nbytes = round(seconds * 1e9 * MEMORY_EFFICIENCY)
    return TracedOp("aten.add.Tensor", phase, "default", 0, nbytes, torch.float32, _keys(reads), _keys(writes))


def _keys(keys) -> tuple[tuple[int, int], ...]:
    return tuple((key, 1) for key in keys)


def _gather(seconds: float, writes, stream: str) -> TracedOp:
    """An all-gather over 2 ranks of one node that takes `seconds` on DEVICE."""
    nbytes = round(seconds * 1e8 * LINK_EFFICIENCY * 2)
    return TracedOp("c10d._allgather_base_.default", "forward", stream, 0, 0, None, (), _keys(writes),
                    Collective("all_gather", nbytes, (0, 1)))  # fmt: skip


def test_an_fsdp_prefetch_hides_its_gather_behind_the_current_blocks_compute():
    # FSDP2: gather block 0 (0.5 s), copy it out (0.1 s) and compute block 0 (1 s) on the default stream; the
    # gather of block 1 waits only for block 0's copy-out, so it runs beside block 0's compute.
    ops = [
        _gather(0.5, (6,), "all_gather"),
        _compute(0.1, reads=(6,)),
        _compute(1.0),
        _gather(0.5, (7,), "all_gather"),
        _compute(0.1, reads=(7,)),
        _compute(1.0),
    ]
    predicted = predict(ops, DEVICE)
    assert predicted.seconds == pytest.approx(0.5 + 2.2)  # only the first gather is exposed
    assert predicted.exposed_communication_seconds == pytest.approx(0.5)
    assert predicted.communication_seconds == pytest.approx(1.0)


def test_an_all_gather_waits_for_the_previous_ones_copy_out():
    # As FSDP2 frees the previous all-gather's buffer only after its copy-out: gather 1 starts at 1.5 s, not
    # right after gather 0 (0.5 s).
    ops = [_gather(0.5, (6,), "all_gather"), _compute(1.0, reads=(6,)), _gather(0.5, (7,), "all_gather"),
           _compute(1.0, reads=(7,))]  # fmt: skip
    assert predict(ops, DEVICE).seconds == pytest.approx(3.0)


def test_a_collective_consumed_at_once_is_exposed():
    # TP: the gathered activations are the next op's input.
    ops = [_compute(1.0), _gather(0.5, (7,), "default"), _compute(1.0, reads=(7,)), _compute(1.0)]
    predicted = predict(ops, DEVICE)
    assert predicted.seconds == pytest.approx(3.5)
    assert predicted.exposed_communication_seconds == pytest.approx(0.5)
    assert predicted.compute_seconds == pytest.approx(3.0)


def test_a_gather_longer_than_the_compute_it_hides_behind_shows_the_difference():
    ops = [
        _gather(0.5, (6,), "all_gather"),
        _compute(0.1, reads=(6,)),
        _compute(1.0),
        _gather(1.5, (7,), "all_gather"),  # 0.6-2.1: the copy-out of block 1 waits from 1.6 to 2.1
        _compute(0.1, reads=(7,)),
        _compute(1.0),
    ]
    predicted = predict(ops, DEVICE)
    assert predicted.seconds == pytest.approx(3.2)
    assert predicted.exposed_communication_seconds == pytest.approx(1.0)


def test_an_op_that_communicates_while_it_computes_takes_the_longer_of_the_two():
    ring = TracedOp("titan.ring_attention.default", "forward", "default", 0, round(1e9 * MEMORY_EFFICIENCY), None,
                    (), (), Collective("all_gather", round(2 * 1e8 * LINK_EFFICIENCY * 2), (0, 1)))  # fmt: skip
    predicted = predict([ring], DEVICE)  # 1 s of compute, 2 s of communication
    assert predicted.seconds == pytest.approx(2.0)
    assert (predicted.compute_seconds, predicted.exposed_communication_seconds) == pytest.approx((1.0, 1.0))


def test_work_left_on_a_side_stream_at_the_end_is_exposed():
    reduce_scatter = TracedOp("c10d._reduce_scatter_base_.default", "backward", "reduce_scatter", 0, 0, None, (), (),
                              Collective("reduce_scatter", round(2 * 1e8 * LINK_EFFICIENCY * 2), (0, 1)))  # fmt: skip
    predicted = predict([_compute(1.0), reduce_scatter], DEVICE)
    assert predicted.seconds == pytest.approx(3.0)
    assert predicted.exposed_communication_seconds == pytest.approx(2.0)


def test_compile_fuses_a_run_of_memory_bound_ops_into_one_pass_over_what_enters_and_leaves_it():
    x, w = torch.randn(256, 64), torch.randn(64, 64)

    def block(x):
        y = torch.relu(x * 2 + 1)  # three elementwise ops: x in, y out, two intermediates in between
        return y @ w

    ops = traced(block, x)
    assert [op.name for op in ops] == ["aten.mul.Tensor", "aten.add.Tensor", "aten.relu.default", "aten.mm.default"]
    fast_math = DEVICE.replace(bf16_flops=1e18, fp32_flops=1e18, tf32_flops=1e18)
    per_byte = 1 / (1e9 * MEMORY_EFFICIENCY)
    tensor = 256 * 64 * 4
    matmul = step_time.op_seconds(ops[-1], fast_math)
    assert predict(ops, fast_math).seconds == pytest.approx(3 * 2 * tensor * per_byte + matmul)
    # Fused: x read once, y written once (the matmul reads it); the two intermediates never reach memory.
    assert predict(ops, fast_math, compiled=True).seconds == pytest.approx(2 * tensor * per_byte + matmul)


def test_compile_keeps_an_in_place_update_and_drops_what_nothing_reads():
    p, g = torch.randn(1000), torch.randn(1000)

    def update(p, g):
        p.add_(g * 0.1)  # g read, g*0.1 an intermediate, p read and written in place

    ops = traced(update, p, g)
    per_byte = 1 / (1e9 * MEMORY_EFFICIENCY)
    assert predict(ops, DEVICE, compiled=True).seconds == pytest.approx(3 * 4000 * per_byte)


@pytest.fixture
def fake_group():
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=4)
    yield
    dist.destroy_process_group()


def test_the_trace_records_collectives_with_their_size_and_group(fake_group):
    shard = torch.randn(1000)
    full = torch.empty(4000)
    group = dist.new_group([0, 1])
    with OpTrace() as trace:
        dist.all_gather_into_tensor(full, shard)
        dist.all_reduce(shard, group=group)
        torch.distributed._functional_collectives.all_gather_tensor(shard, 0, group).wait()
    collectives = [op.collective for op in trace.ops if op.collective]
    assert collectives == [
        Collective("all_gather", 16000, (0, 1, 2, 3)),
        Collective("all_reduce", 4000, (0, 1)),
        Collective("all_gather", 8000, (0, 1)),
    ]
    gather, *_ = (op for op in trace.ops if op.collective)
    (wait,) = (op for op in trace.ops if op.name.startswith("_c10d_functional.wait_tensor"))
    functional = [op for op in trace.ops if op.collective][-1]
    assert {k for k, _ in wait.reads} & {k for k, _ in functional.writes}  # the wait reads what it wrote
    assert gather.writes  # the in-place all-gather writes its output argument


def test_every_device_has_the_figures_the_model_needs():
    for name, device in DEVICES.items():
        assert device.name == name
        assert device.bf16_flops > 1e14 and device.memory_bandwidth > 1e12 and device.gpus_per_node == 8
        assert device.intra_node_bandwidth > device.inter_node_bandwidth > 0
    assert DEVICES["a100-sxm-80gb"].fp8_flops is None
    assert DEVICES["h100-sxm-80gb"].fp8_flops == 2 * DEVICES["h100-sxm-80gb"].bf16_flops
    paper = DEVICES["h100-sxm-96gb-500w"]
    assert DEVICES["h100-sxm-80gb"].bf16_flops > paper.bf16_flops > 835.5e12  # between SXM and NVL
    with pytest.raises(KeyError, match="unknown GPU 'h1000'; known: h100-sxm-96gb-500w"):
        get_device("h1000")
    with pytest.raises(ValueError, match=r"unknown device figure\(s\) \['tflops'\]"):
        paper.replace(tflops=1)


def _one_f_one_b(rank: int, pp: int, n: int) -> list[tuple[int, str, int]]:
    warmup = min(n, pp - rank)
    order = [(rank, "F", m) for m in range(warmup)]
    for m in range(n):
        order += [(rank, "B", m)] + ([(rank, "F", warmup + m)] if warmup + m < n else [])
    return order


def test_a_1f1b_pipeline_has_the_textbook_bubble():
    # 2 stages, 4 micro-batches, F 1 s and B 2 s each: (n + p - 1)(F + B) = 15 s, of which each rank computes
    # 12: a bubble of (p - 1)(F + B) = 3 s on each.
    order = {rank: _one_f_one_b(rank, 2, 4) for rank in range(2)}
    timeline = pipeline_time.simulate_schedule(order, {0: 1.0, 1: 1.0}, {0: 2.0, 1: 2.0}, transfer=0.0)
    assert timeline.seconds == pytest.approx(15.0)
    assert timeline.busy == {0: 12.0, 1: 12.0}
    assert timeline.bubble(0) == pytest.approx(3.0) and timeline.finish[1] == pytest.approx(13.0)
    # With 0.5 s per transfer, rank 0 waits for each gradient: B0 at 5-7, B1 8-10, B2 12-14, B3 15-17 (by hand:
    # each waits for rank 1's B of the micro-batch, which waited for the activations sent after rank 0's F).
    slow_link = pipeline_time.simulate_schedule(order, {0: 1.0, 1: 1.0}, {0: 2.0, 1: 2.0}, transfer=0.5)
    assert slow_link.seconds == pytest.approx(17.0)


def test_more_micro_batches_shrink_the_bubble_share_and_gpipe_waits_like_1f1b():
    order = {rank: _one_f_one_b(rank, 4, 16) for rank in range(4)}
    timeline = pipeline_time.simulate_schedule(order, dict.fromkeys(range(4), 1.0), dict.fromkeys(range(4), 2.0), 0.0)
    assert timeline.seconds == pytest.approx((16 + 3) * 3.0)
    gpipe = {rank: [(rank, "F", m) for m in range(16)] + [(rank, "B", m) for m in range(16)] for rank in range(4)}
    same = pipeline_time.simulate_schedule(gpipe, dict.fromkeys(range(4), 1.0), dict.fromkeys(range(4), 2.0), 0.0)
    assert same.seconds == pytest.approx(timeline.seconds)


def test_a_split_backward_lets_weight_gradients_fill_the_bubble():
    # 2 stages, 2 micro-batches: with B split into I and W and the W's deferred, stage 0's I can start as soon
    # as stage 1's I is done, half a B earlier.
    full = {
        0: [(0, "F", 0), (0, "F", 1), (0, "B", 0), (0, "B", 1)],
        1: [(1, "F", 0), (1, "B", 0), (1, "F", 1), (1, "B", 1)],
    }
    split = {
        0: [(0, "F", 0), (0, "F", 1), (0, "I", 0), (0, "I", 1), (0, "W", 0), (0, "W", 1)],
        1: [(1, "F", 0), (1, "I", 0), (1, "F", 1), (1, "I", 1), (1, "W", 0), (1, "W", 1)],
    }
    times = ({0: 1.0, 1: 1.0}, {0: 2.0, 1: 2.0})
    assert pipeline_time.simulate_schedule(full, *times, 0.0).seconds == pytest.approx(9.0)
    assert pipeline_time.simulate_schedule(split, *times, 0.0).seconds == pytest.approx(8.0)


def test_a_schedule_that_cannot_progress_is_an_error():
    deadlock = {0: [(0, "B", 0), (0, "F", 0)], 1: [(1, "F", 0), (1, "B", 0)]}
    with pytest.raises(ValueError, match="cannot progress"):
        pipeline_time.simulate_schedule(deadlock, {0: 1.0, 1: 1.0}, {0: 1.0, 1: 1.0}, 0.0)


def test_async_tp_collectives_overlap_the_matmuls_that_consume_them():
    ops = [_compute(1.0), _gather(0.5, (7,), "default"), _compute(1.0, reads=(7,)), _compute(1.0)]
    assert predict(ops, DEVICE).seconds == pytest.approx(3.5)  # TP: exposed
    assert predict(ops, DEVICE, overlapped_groups=((0, 1),)).seconds == pytest.approx(3.0)
    assert predict(ops, DEVICE, overlapped_groups=((0, 2),)).seconds == pytest.approx(3.5)  # another group


def test_a_launch_bound_step_waits_for_the_cpu(monkeypatch):
    monkeypatch.setattr(step_time, "HOST_SECONDS_PER_OP", 1.0)
    small = [_compute(0.25) for _ in range(4)]  # the CPU issues one op a second: the GPU idles 3/4 of it
    predicted = predict(small, DEVICE)
    assert predicted.seconds == pytest.approx(4.25)
    assert (predicted.compute_seconds, predicted.host_bound_seconds) == pytest.approx((1.0, 3.25))
    large = [_compute(2.0) for _ in range(4)]  # GPU-bound: the CPU runs ahead
    assert predict(large, DEVICE).seconds == pytest.approx(9.0)
    # Compiled, the CPU launches the kernels left after fusion: one for the four memory-bound ops.
    chain = traced(lambda x: torch.relu(x * 2 + 1).neg(), torch.randn(1000))
    assert predict(chain, DEVICE, compiled=True).host_bound_seconds == pytest.approx(1.0, abs=1e-3)
    # A CPU runs its own dispatch: serial, whatever the sizes.
    cpu = DEVICE.replace(overlapping_streams=False)
    assert predict(large, cpu).seconds == pytest.approx(12.0)


def test_unwrapping_an_ops_arguments_gives_what_pytree_gives():
    """OpTrace's own walk over an op's arguments (it runs on every argument of every op) against pytree's
    tree_map(_local, ...): the same local tensor objects in the same places, through lists, tuples, dicts and a
    named return (a plain tuple in both: pytree keeps the structseq, the trace needs only its items)."""
    from torch.testing._internal.two_tensor import TwoTensor
    from torch.utils._pytree import tree_map

    from titan_debug.op_trace import _local, _unwrapped

    a, b = torch.ones(2), torch.zeros(2)
    wrapped = TwoTensor(a, b)
    args = (a, [wrapped, 3, (TwoTensor(b, a), None)], {"k": wrapped, "s": "x"}, torch.return_types.max((wrapped, b)))

    def same(got, expected) -> None:
        if isinstance(expected, torch.Tensor):
            assert got is expected
        elif isinstance(expected, dict):
            assert type(got) is dict and got.keys() == expected.keys()
            for key in expected:
                same(got[key], expected[key])
        elif isinstance(expected, (list, tuple)):
            assert type(got) is (list if isinstance(expected, list) else tuple) and len(got) == len(expected)
            for g, e in zip(got, expected, strict=True):
                same(g, e)
        else:
            assert got == expected

    unwrapped = _unwrapped(args)
    same(unwrapped, tree_map(_local, args))
    assert unwrapped[1][0] is a and unwrapped[2]["k"] is a  # TwoTensor's first inner tensor
