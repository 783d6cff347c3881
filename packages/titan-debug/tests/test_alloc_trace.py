"""AllocationTracker on real CPU tensors, fake tensors and a fake process group, against hand-counted bytes."""

import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

from titan_debug.alloc_trace import AllocationTracker
from titan_debug.caching_allocator import replay

F32 = 4


def _mlp_step(tracker: AllocationTracker) -> None:
    """x[4,16] @ w1[16,32] -> relu -> @ w2[32,8] -> sum, then backward."""
    with tracker.phase("inputs"):
        x = torch.randn(4, 16)
        w1 = torch.randn(16, 32, requires_grad=True)
        w2 = torch.randn(32, 8, requires_grad=True)
    with tracker.phase("forward"):
        loss = (torch.relu(x @ w1) @ w2).sum()
    with tracker.phase("backward"):
        loss.backward()


def _mlp_expected_peak() -> int:
    # The peak is the last backward matmul, grad_w1 = x.T @ grad_h. Alive then: the inputs, the loss, the
    # seed gradient, grad_w2 (kept as w2.grad), grad_h (threshold_backward's output) and grad_w1 itself; the
    # forward activations are gone: h died after relu, relu's output after its backward, the logits after sum.
    inputs = (4 * 16 + 16 * 32 + 32 * 8) * F32
    loss, seed = F32, F32
    grad_w2, grad_h, grad_w1 = 32 * 8 * F32, 4 * 32 * F32, 16 * 32 * F32
    return inputs + loss + seed + grad_w2 + grad_h + grad_w1


def test_mlp_forward_backward_peak_is_the_hand_counted_live_storages():
    with AllocationTracker("cpu") as tracker:
        _mlp_step(tracker)
    peak = tracker.peak_active()
    assert peak.bytes == _mlp_expected_peak() == 6920
    assert (peak.op, peak.phase) == ("aten.mm.default", "backward")
    assert tracker.bytes_by_phase_at_peak() == {
        "inputs": (4 * 16 + 16 * 32 + 32 * 8) * F32,
        "forward": F32,  # the loss
        "backward": F32 + (32 * 8 + 4 * 32 + 16 * 32) * F32,
    }
    assert tracker.active_bytes() == 0  # the step's tensors and gradients died when it returned


def test_every_free_matches_an_earlier_alloc_of_the_same_block():
    with AllocationTracker("cpu") as tracker:
        _mlp_step(tracker)
    allocated = {}
    for event in tracker.events:
        if event.action == "alloc":
            allocated[event.block] = event
        else:
            origin = allocated.pop(event.block)
            assert (event.nbytes, event.op, event.stream) == (origin.nbytes, origin.op, origin.stream)


def test_track_existing_counts_tensors_made_before_once_and_sees_them_die():
    weight = torch.empty(8, 8)
    shared = weight.view(64)
    with AllocationTracker("cpu") as tracker:
        tracker.track_existing([weight, shared, torch.empty(0)], phase="params")
        assert tracker.active_bytes() == 256
        del weight, shared
    assert [(e.action, e.nbytes, e.op, e.phase) for e in tracker.events] == [
        ("alloc", 256, "existing", "params"),
        ("free", 256, "existing", "unlabeled"),
    ]


def test_views_count_once_and_in_place_ops_allocate_nothing():
    with AllocationTracker("cpu") as tracker:
        base = torch.zeros(16, 16)
        view = base.view(256)
        base.add_(1)
        view[:8].mul_(2)
        torch.add(base, 1, out=base)
        del base
        assert [(e.action, e.nbytes, e.op) for e in tracker.events] == [("alloc", 1024, "aten.zeros.default")]
        del view  # the last tensor on the storage: now it is freed
    assert [e.action for e in tracker.events] == ["alloc", "free"]
    assert tracker.active_bytes() == 0


def test_views_and_in_place_ops_on_untracked_tensors_allocate_nothing():
    before = torch.zeros(64)
    with AllocationTracker("cpu") as tracker:
        before.view(8, 8).add_(1)
        before[:4].zero_()
    assert tracker.events == []


def test_phases_nest_and_streams_label_allocations():
    with AllocationTracker("cpu") as tracker:
        with tracker.phase("step"):
            a = torch.empty(8)
            with tracker.phase("all_gather"), tracker.stream("all_gather"):
                b = torch.empty(16)
            c = torch.empty(4)
    assert [(e.phase, e.stream) for e in tracker.events] == [
        ("step", "default"),
        ("all_gather", "all_gather"),
        ("step", "default"),
    ]
    del a, b, c


def test_storage_resize_is_a_free_and_an_allocation():
    """FSDP2 frees unsharded parameters with ``storage.resize_(0)`` and brings them back the same way."""
    original_resize = torch.UntypedStorage.resize_
    with AllocationTracker("cpu") as tracker:
        param = torch.empty(256)
        param.untyped_storage().resize_(0)
        with tracker.phase("forward"):
            param.untyped_storage().resize_(1024)
    assert [(e.action, e.nbytes, e.op, e.phase) for e in tracker.events] == [
        ("alloc", 1024, "aten.empty.memory_format", "unlabeled"),
        ("free", 1024, "aten.empty.memory_format", "unlabeled"),
        ("alloc", 1024, "UntypedStorage.resize_", "forward"),
    ]
    assert torch.UntypedStorage.resize_ is original_resize  # restored on exit


def test_fake_tensors_give_the_same_trace_as_real_ones():
    with AllocationTracker("cpu") as real:
        _mlp_step(real)
    with FakeTensorMode(), AllocationTracker("cpu") as fake:
        _mlp_step(fake)
    assert [(e.action, e.nbytes, e.op, e.phase) for e in fake.events] == [
        (e.action, e.nbytes, e.op, e.phase) for e in real.events
    ]
    assert fake.peak_active() == real.peak_active()


def test_fake_tensors_stand_for_their_device_and_the_filter_follows_it():
    with FakeTensorMode(), AllocationTracker("cuda") as tracker:
        on_gpu = torch.empty(1024, device="cuda")
        on_cpu = torch.empty(1024)
        big = torch.empty(64 * 1024 * 1024, device="cuda")  # 256 MiB, never really allocated
    assert [e.nbytes for e in tracker.events] == [4096, 256 * 1024 * 1024]
    assert replay(tracker.events).peak_reserved.bytes == 2 * 1024 * 1024 + 256 * 1024 * 1024
    del on_gpu, on_cpu, big


ALL_GATHER_ON_A_FAKE_PROCESS_GROUP = """
import sys
import torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.tensor import DTensor, Replicate, Shard, init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore
from titan_debug.alloc_trace import AllocationTracker

dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=4)
mesh = init_device_mesh("cpu", (4,))
with (FakeTensorMode() if sys.argv[1] == "fake" else torch.no_grad()):
    with AllocationTracker("cpu") as tracker:
        shard = torch.empty(4, 8)
        with tracker.phase("funcol"), tracker.stream("all_gather"):
            gathered = funcol.wait_tensor(funcol.all_gather_tensor(shard, 0, mesh))
        with tracker.phase("c10d"):
            out = torch.empty(16, 8)
            dist.all_gather_into_tensor(out, shard)
        with tracker.phase("dtensor"):
            local = DTensor.from_local(torch.empty(2, 8), mesh, [Shard(0)])
            full = local.redistribute(mesh, [Replicate()])
        with tracker.phase("dtensor_op"):
            doubled = local * 2
for e in tracker.events:
    print(e.action, e.nbytes, e.op, e.phase, e.stream)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("mode", ["real", "fake"])
def test_collective_outputs_on_a_fake_process_group_are_recorded(mode):
    # A subprocess: the default process group is global state other tests must not inherit.
    result = subprocess.run(
        [sys.executable, "-c", ALL_GATHER_ON_A_FAKE_PROCESS_GROUP, mode],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    gather = "_c10d_functional.all_gather_into_tensor.default"
    assert result.stdout.splitlines() == [
        "alloc 128 aten.empty.memory_format unlabeled default",
        f"alloc 512 {gather} funcol all_gather",  # 4 ranks x 4x8 floats; wait_tensor returns the same memory
        "alloc 512 aten.empty.memory_format c10d default",  # the in-place all-gather itself allocates nothing
        "alloc 64 aten.empty.memory_format dtensor default",  # the local shard, not the global 8x8
        f"alloc 256 {gather} dtensor default",  # the replicated DTensor's local tensor
        "alloc 64 aten.mul.Tensor dtensor_op default",  # an op on a sharded 8x8 DTensor: its 2x8 shard
    ]
    assert not dist.is_initialized()
