"""The caching allocator model against hand-worked sequences, one rule of CUDACachingAllocator.cpp per test."""

import random

import pytest

from titan_debug.alloc_trace import AllocEvent
from titan_debug.caching_allocator import CachingAllocatorModel, SimulatedOutOfMemory, replay

MIB = 1024**2

KiB = 1024
MiB = 1024 * 1024


def test_requests_round_up_to_512_bytes():
    allocator = CachingAllocatorModel()
    allocator.malloc(1)
    assert allocator.allocated_bytes == 512
    allocator.malloc(513)
    assert allocator.allocated_bytes == 512 + 1024


def test_zero_byte_request_allocates_nothing():
    allocator = CachingAllocatorModel()
    allocator.free(allocator.malloc(0))
    assert (allocator.allocated_bytes, allocator.reserved_bytes) == (0, 0)


def test_small_requests_are_carved_from_2_mib_segments():
    allocator = CachingAllocatorModel()
    allocator.malloc(1 * MiB)  # the largest small request
    assert allocator.reserved_bytes == 2 * MiB
    allocator.malloc(1 * MiB)  # the second half of the same segment
    assert (allocator.reserved_bytes, allocator.segments) == (2 * MiB, 1)


def test_requests_under_10_mib_get_20_mib_segments_larger_ones_round_to_2_mib():
    allocator = CachingAllocatorModel()
    allocator.malloc(1 * MiB + 1)  # the smallest large request
    assert allocator.reserved_bytes == 20 * MiB
    allocator = CachingAllocatorModel()
    allocator.malloc(10 * MiB)  # kMinLargeAlloc: its own segment, already a multiple of 2 MiB
    assert allocator.reserved_bytes == 10 * MiB
    allocator.malloc(11 * MiB + 1)  # rounded up to 12 MiB
    assert allocator.reserved_bytes == 10 * MiB + 12 * MiB


def test_best_fit_takes_the_smallest_free_block_not_the_first():
    allocator = CachingAllocatorModel()
    sixteen = allocator.malloc(16 * MiB)  # lower address
    twelve = allocator.malloc(12 * MiB)
    allocator.free(sixteen)
    allocator.free(twelve)
    allocator.malloc(11 * MiB)  # fits both; best fit picks the 12 MiB block
    allocator.malloc(15 * MiB)  # so the 16 MiB block is still whole for this one
    assert (allocator.reserved_bytes, allocator.segments) == (28 * MiB, 2)


def test_small_pool_splits_a_remainder_of_512_bytes():
    allocator = CachingAllocatorModel()
    allocator.malloc(1 * MiB)
    allocator.malloc(1 * MiB - 512)  # leaves exactly 512 B: still split off
    allocator.malloc(512)  # and used here
    assert allocator.segments == 1
    assert allocator.allocated_bytes == 2 * MiB


def test_large_pool_keeps_a_remainder_of_1_mib_unsplit():
    allocator = CachingAllocatorModel()
    allocator.malloc(19 * MiB)  # a 20 MiB segment; the 1 MiB remainder stays with the block
    assert allocator.allocated_bytes == 20 * MiB

    allocator = CachingAllocatorModel()
    allocator.malloc(19 * MiB - 512)  # remainder 1 MiB + 512 B > 1 MiB: split off
    assert allocator.allocated_bytes == 19 * MiB - 512
    allocator.malloc(1 * MiB + 512)  # fits the remainder, no new segment
    assert (allocator.reserved_bytes, allocator.segments) == (20 * MiB, 1)


def test_freed_neighbours_coalesce_with_the_previous_and_the_next_block():
    allocator = CachingAllocatorModel()
    first, second, third = (allocator.malloc(5 * MiB) for _ in range(3))  # one 20 MiB segment, 5 MiB left
    allocator.free(second)
    allocator.free(first)  # merges with the free block after it: 10 MiB at the front
    allocator.malloc(8 * MiB)  # so this fits in the segment, splitting off 2 MiB
    assert allocator.segments == 1
    allocator.free(third)  # merges with the 2 MiB before it and the 5 MiB after it
    allocator.malloc(12 * MiB)  # 2 + 5 + 5 = 12 MiB
    assert (allocator.reserved_bytes, allocator.segments) == (20 * MiB, 1)


def test_blocks_are_reused_only_on_the_stream_that_made_them():
    allocator = CachingAllocatorModel()
    allocator.free(allocator.malloc(4 * MiB, stream="all_gather"))
    allocator.malloc(4 * MiB, stream="all_gather")  # reuses the cached segment
    assert allocator.segments == 1
    allocator.free(allocator.malloc(4 * KiB, stream="reduce_scatter"))
    allocator.malloc(4 * KiB, stream="default")  # the cached small segment belongs to reduce_scatter
    assert allocator.segments == 3


def test_over_capacity_releases_cached_segments_and_retries():
    allocator = CachingAllocatorModel(capacity_bytes=40 * MiB)
    allocator.free(allocator.malloc(20 * MiB))  # cached: 20 MiB reserved, nothing allocated
    allocator.malloc(22 * MiB)  # 20 + 22 > 40: the cached segment is released first
    assert (allocator.reserved_bytes, allocator.segments, allocator.num_alloc_retries) == (22 * MiB, 1, 1)


def test_over_capacity_keeps_split_segments_and_then_fails():
    allocator = CachingAllocatorModel(capacity_bytes=40 * MiB)
    allocator.malloc(2 * MiB)  # a 20 MiB segment, partly in use: it cannot be released
    with pytest.raises(SimulatedOutOfMemory, match="22020096 B"):
        allocator.malloc(21 * MiB)
    assert allocator.reserved_bytes == 20 * MiB


def test_expandable_segments_map_20_mib_pages_and_split_any_remainder():
    allocator = CachingAllocatorModel(expandable_segments=True)
    allocator.malloc(30 * MiB)  # two 20 MiB pages of the large pool's segment
    assert (allocator.reserved_bytes, allocator.allocated_bytes) == (40 * MiB, 30 * MiB)
    allocator.malloc(10 * MiB - 512)  # the mapped 10 MiB left; its 512 B remainder is split off
    assert (allocator.reserved_bytes, allocator.allocated_bytes) == (40 * MiB, 40 * MiB - 512)
    allocator.malloc(4 * KiB)  # the small pool has its own segment, in 2 MiB pages
    assert (allocator.reserved_bytes, allocator.segments) == (42 * MiB, 2)


def test_expandable_segment_grows_in_place_over_its_free_tail():
    allocator = CachingAllocatorModel(expandable_segments=True)
    allocator.malloc(15 * MiB)  # maps 20 MiB, 5 MiB free at the end
    allocator.malloc(22 * MiB)  # starts in the free 5 MiB, so one more page is enough (not two)
    assert (allocator.reserved_bytes, allocator.segments, allocator.allocated_bytes) == (40 * MiB, 1, 37 * MiB)
    allocator.malloc(3 * MiB)  # the 3 MiB left after it
    assert allocator.reserved_bytes == 40 * MiB


def test_expandable_segments_unmap_free_pages_when_over_capacity():
    allocator = CachingAllocatorModel(capacity_bytes=60 * MiB, expandable_segments=True)
    first = allocator.malloc(20 * MiB)
    allocator.malloc(20 * MiB)
    allocator.free(first)  # a free mapped page at the start of the segment
    allocator.malloc(30 * MiB)  # two pages more would make 80 MiB: the free page is unmapped first
    assert (allocator.reserved_bytes, allocator.num_alloc_retries) == (60 * MiB, 1)
    assert allocator.allocated_bytes == 50 * MiB


def test_replay_reports_the_reserved_peak_where_fragmentation_causes_it():
    events = [
        AllocEvent("alloc", 12 * MiB, 0, "aten.mm.default", "forward"),
        AllocEvent("alloc", 12 * MiB, 1, "aten.mm.default", "forward"),
        AllocEvent("free", 12 * MiB, 0, "aten.mm.default", "forward"),
        # 12 MiB is cached but 14 MiB does not fit in it: a third segment
        AllocEvent("alloc", 14 * MiB, 2, "aten.relu.default", "backward"),
        AllocEvent("free", 12 * MiB, 1, "aten.mm.default", "backward"),
        AllocEvent("free", 14 * MiB, 2, "aten.relu.default", "backward"),
    ]
    result = replay(events)
    assert (result.peak_reserved.bytes, result.peak_reserved.index) == (38 * MiB, 3)
    assert (result.peak_reserved.op, result.peak_reserved.phase, result.segments) == (
        "aten.relu.default",
        "backward",
        3,
    )
    assert (result.peak_allocated.bytes, result.peak_allocated.index) == (26 * MiB, 3)


def test_replay_rejects_a_free_of_an_unknown_block():
    with pytest.raises(ValueError, match="block 7 is freed but was never allocated"):
        replay([AllocEvent("free", 512, 7, "aten.mm.default", "forward")])


@pytest.mark.parametrize("expandable", [False, True])
def test_random_traces_keep_the_block_lists_consistent(expandable):
    """Bookkeeping invariants after every step of a random trace: reserved bytes are the mapped blocks,
    allocated bytes the live ones, segments are contiguous, and no two free neighbours are left unmerged."""
    rng = random.Random(0)
    allocator = CachingAllocatorModel(capacity_bytes=400 * MiB, expandable_segments=expandable)
    live = []
    for _ in range(1500):
        if live and rng.random() < 0.45:
            allocator.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice([rng.randint(1, 64 * KiB), rng.randint(1, 2 * MiB), rng.randint(1, 24 * MiB)])
            stream = rng.choice(["default", "default", "all_gather"])
            try:
                live.append(allocator.malloc(size, stream))
            except SimulatedOutOfMemory:
                continue
        blocks = {id(b): b for b in live}
        blocks.update((id(e[-1]), e[-1]) for pool in allocator._free.values() for e in pool)
        blocks.update((id(e[-1]), e[-1]) for pool in allocator._unmapped.values() for e in pool)
        assert allocator.allocated_bytes == sum(b.size for b in live)
        assert allocator.reserved_bytes == sum(b.size for b in blocks.values() if b.mapped) <= 400 * MiB
        for block in blocks.values():
            if block.next is not None:
                assert id(block.next) in blocks and block.next.prev is block
                assert block.next.address == block.address + block.size
                both_free = not block.allocated and not block.next.allocated
                assert not (both_free and block.mapped == block.next.mapped), "free neighbours left unmerged"


@pytest.mark.parametrize("cuda_placed_second_segment_lower", [True, False])
def test_segment_addresses_decide_which_equal_free_block_is_reused(cuda_placed_second_segment_lower):
    """Two free 1 MiB blocks in two small segments: the lower address is reused, so where cudaMalloc put the
    segments decides whether the first segment empties and is released."""
    model = CachingAllocatorModel()
    first_address, second_address = (100 << 30, 1 << 30) if cuda_placed_second_segment_lower else (None, None)
    a = model.malloc(MIB, segment_address=first_address)  # segment 1: a and a free 1 MiB rest
    b = model.malloc(MIB)  # takes segment 1's rest
    model.malloc(MIB, segment_address=second_address)  # segment 2: one block and a free 1 MiB rest
    model.free(a)
    model.malloc(MIB)  # one of the two free 1 MiB blocks, the one at the lower address
    model.free(b)
    model.release_cached_segments()
    # Segment 2 lower: its rest was taken, segment 1 emptied and was released; else segment 1 is still in use.
    assert model.reserved_bytes == (1 if cuda_placed_second_segment_lower else 2) * 2 * MIB
