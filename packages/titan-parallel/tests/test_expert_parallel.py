"""Expert parallelism: the token dispatch and apply_ep on 2 and 4 gloo ranks (ep_script.py, one launch each),
the expert-parallel mesh and its checks in one process."""

import random
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))  # multiprocess.py beside the tests (importlib mode)

from multiprocess import launch  # noqa: E402

from titan_parallel import ParallelDims
from titan_parallel.ep.token_dispatch import balanced_split_sizes, expert_major_order

SCRIPT = Path(__file__).with_name("ep_script.py")
CASES = ["dispatch_random", "dispatch_silent", "dispatch_one_expert", "apply_ep"]


@pytest.mark.parametrize("world", [2, 4])
def test_dispatch_and_apply_ep_equal_the_unsharded_experts(world):
    output = launch(SCRIPT, world)
    missing = [f"rank {r} {name}" for name in CASES for r in range(world)]
    missing = [line for line in missing if f"{line} ok" not in output]
    assert not missing, f"not ok: {missing}\n{output[-6000:]}"


def test_rows_arrive_source_major_and_leave_expert_major():
    # From rank 0: 1 row for local expert 0, 2 for expert 1; from rank 1: 3 for expert 0, none for expert 1.
    received = [[1, 2], [3, 0]]
    # Source-major rows: [r0e0, r0e1, r0e1, r1e0, r1e0, r1e0] -> expert 0 (ranks 0, 1) then expert 1.
    assert expert_major_order(received).tolist() == [0, 3, 4, 5, 1, 2]
    assert expert_major_order([[0, 0], [0, 0]]).tolist() == []


def test_the_order_equals_the_blocks_taken_expert_by_expert_in_a_few_ops_whatever_the_number_of_experts():
    generator, ops = random.Random(0), {}
    for ep, local in [(1, 1), (2, 3), (4, 5), (8, 16)]:
        received = [[generator.choice([0, 1, 2, 7]) for _ in range(local)] for _ in range(ep)]
        # The reference is torch's stable sort of the source-major rows by their local expert: expert-major, and
        # within an expert in source-rank order.
        experts = torch.tensor([j for row in received for j, size in enumerate(row) for _ in range(size)])
        with _CountedOps() as counted:
            order = expert_major_order(received)
        assert order.tolist() == torch.argsort(experts, stable=True).tolist(), received
        ops[ep, local] = counted.ops
    # A GPU launches each op: 128 experts on 8 ranks must not mean 128 ranges and a cat per MoE layer.
    assert max(ops.values()) <= 8, ops


def test_a_dry_run_routes_every_rank_evenly():
    sent, received = balanced_split_sizes(torch.empty(10, 4), torch.zeros(4), torch.zeros(2, 2))
    assert sent == [6, 4] and received == [[3, 3], [3, 3]]
    rows, counts, exchanged = torch.empty(1000, 4), torch.zeros(128), torch.zeros(8, 16)
    with _CountedOps() as counted:  # a dry run simulates every op: host arithmetic only
        sent, received = balanced_split_sizes(rows, counts, exchanged)
    assert counted.ops == 0
    share = [len(part) for part in torch.arange(1000).tensor_split(128)]
    assert received == [share[:16]] * 8 and sent == [sum(share[r * 16 : (r + 1) * 16]) for r in range(8)]


class _CountedOps(TorchDispatchMode):
    ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def test_expert_parallel_ranks_come_from_data_and_context_ranks():
    dims = ParallelDims(dp_replicate=1, dp_shard=4, cp=2, tp=1, pp=1, world_size=8, ep=4)
    assert (dims.edp_shard, dims.dp_shard_in_ep, dims.degree("ep"), dims.dp) == (2, 2, 4, 4)
    assert dims.degree("dp_shard_cp") == 8 and dims.degree("dp_shard") == 4
    assert "experts: ep 4 x fsdp 2" in dims.describe()


def test_tensor_parallel_ranks_join_the_expert_parallel_group():
    # TorchTitan's ETP = 1: routed experts are not tensor-parallel; the tp ranks split them with the data ranks.
    dims = ParallelDims(dp_replicate=1, dp_shard=4, cp=1, tp=2, pp=1, world_size=8, ep=4)
    assert (dims.edp_shard, dims.dp_shard_in_ep, dims.degree("ep"), dims.dp) == (2, 2, 4, 4)
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=2, pp=1, world_size=2, ep=2)
    assert (dims.edp_shard, dims.dp_shard_in_ep) == (1, 1)


def test_expert_groups_are_the_ranks_the_mesh_gives_each_expert_parallel_group():
    dims = ParallelDims(dp_replicate=2, dp_shard=4, cp=1, tp=2, pp=2, world_size=32, ep=4)
    groups = dims.expert_groups()
    assert len(groups) == 8 and sorted(r for g in groups for r in g) == list(range(32))
    # The innermost dimensions (dp_shard_in_ep, cp, tp) flattened: runs of ep neighbouring ranks.
    assert groups[:2] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # The same groups as the mesh's "ep" view, built over fake process groups.
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    for rank in (0, 13):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=32)
        try:
            built = ParallelDims(dp_replicate=2, dp_shard=4, cp=1, tp=2, pp=2, world_size=32, ep=4)
            built.build_mesh("cpu")
            ep_ranks = dist.get_process_group_ranks(built.submesh("ep").get_group())
            assert ep_ranks in groups and rank in ep_ranks
        finally:
            dist.destroy_process_group()
    assert ParallelDims(dp_replicate=1, dp_shard=2, cp=1, tp=1, pp=1, world_size=2).expert_groups() == []


@pytest.mark.parametrize(
    "degrees, message",
    [
        (dict(dp_shard=4, cp=1, tp=1, ep=3), r"ep=3 must divide dp_shard=4 x cp=1 x tp=1 = 4 .* valid here: \[2, 4\]"),
        (dict(dp_shard=1, cp=4, tp=1, ep=2), r"ep=2 .* be a multiple of cp x tp = 4"),
        (dict(dp_shard=2, cp=1, tp=4, ep=2), r"ep=2 .* be a multiple of cp x tp = 4 .* valid here: \[4, 8\]"),
    ],
)
def test_impossible_expert_parallel_degrees_are_refused(degrees, message):
    world = degrees["dp_shard"] * degrees["cp"] * degrees["tp"]
    with pytest.raises(ValueError, match=message):
        ParallelDims(dp_replicate=1, pp=1, world_size=world, **degrees)
