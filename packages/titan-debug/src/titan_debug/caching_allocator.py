"""A model of torch's CUDA caching allocator: what an alloc/free trace reserves from the device.

``nvidia-smi`` and TorchTitan's memory log show *reserved* memory (segments the allocator took with
``cudaMalloc``), not the bytes tensors hold. Replaying an ``AllocationTracker`` trace through this model gives
that figure on a machine without a GPU. It follows ``c10/cuda/CUDACachingAllocator.cpp`` with the default
``PYTORCH_CUDA_ALLOC_CONF`` (no ``max_split_size_mb``, no ``roundup_power2_divisions``, no expandable
segments, no garbage-collection threshold):

- a request of 0 bytes allocates nothing; others are rounded up to a multiple of 512 B (``kMinBlockSize``);
- requests up to 1 MiB (``kSmallSize``) come from the small pool, whose segments are 2 MiB (``kSmallBuffer``);
  larger ones from the large pool, whose segments are 20 MiB (``kLargeBuffer``) for requests under 10 MiB
  (``kMinLargeAlloc``) and the request rounded up to 2 MiB (``kRoundLarge``) otherwise;
- a free block is reused only by the pool and stream that made its segment; the best fit is the smallest
  free block that is large enough, the lowest address among equals (``BlockComparatorSize``). Where cudaMalloc
  puts a segment is the driver's choice: the model places each new segment past the last unless told the real
  address (``malloc(..., segment_address=)``), so a tie between equal free blocks in different segments can
  go the other way and, later, one segment more or less be reserved than torch reserves;
- the allocated block takes the front of the chosen block; the rest is split off as a new free block when it
  is at least 512 B (small pool) or more than 1 MiB (large pool), else the request keeps the whole block;
- a freed block merges with free neighbours of its segment;
- when a new segment would exceed the capacity, every free whole segment is released (``cudaFree``) and the
  segment is tried once more; if it still does not fit, the allocation fails like a CUDA OOM.

With ``expandable_segments=True`` it models ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, which
TorchTitan's launch scripts set: per pool and stream one segment of address space, backed by 2 MiB (small
pool) or 20 MiB (large pool) pages mapped at the lowest free addresses that can hold a request; remainders of
512 B or more are split off in both pools; releasing the cache unmaps the whole pages of free blocks.

Not modelled: ``record_stream`` deferred frees (blocks freed while another stream still uses them), CUDA
graph private pools, and the driver's own memory (CUDA context, NCCL buffers), which ``reserved`` excludes too.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterable
from dataclasses import dataclass

from titan_debug.alloc_trace import AllocEvent, Peak

K_MIN_BLOCK_SIZE = 512
K_SMALL_SIZE = 1024 * 1024
K_SMALL_BUFFER = 2 * 1024 * 1024
K_LARGE_BUFFER = 20 * 1024 * 1024
K_MIN_LARGE_ALLOC = 10 * 1024 * 1024
K_ROUND_LARGE = 2 * 1024 * 1024


def round_size(nbytes: int) -> int:
    """The block size a request occupies."""
    return max(K_MIN_BLOCK_SIZE, -(-nbytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE)


def segment_size(rounded: int) -> int:
    """The size of a new segment made for a request of `rounded` bytes that no cached block fits."""
    if rounded <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if rounded < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-rounded // K_ROUND_LARGE) * K_ROUND_LARGE


class SimulatedOutOfMemory(MemoryError):
    """A request the modelled device could not hold even after releasing its cached segments."""

    def __init__(self, requested: int, segment: int, reserved: int, allocated: int, capacity: int):
        self.requested, self.segment, self.reserved, self.allocated, self.capacity = (
            requested,
            segment,
            reserved,
            allocated,
            capacity,
        )
        super().__init__(
            f"simulated CUDA out of memory: tried to allocate {requested} B ({segment} B of new device memory) with "
            f"{reserved} B reserved and {allocated} B allocated of a {capacity} B capacity"
        )


@dataclass(eq=False)
class _Block:
    address: int
    size: int
    stream: str
    small: bool
    allocated: bool = False
    mapped: bool = True  # False: address space of an expandable segment with no memory behind it yet
    expandable: bool = False
    prev: _Block | None = None  # neighbours inside the same segment
    next: _Block | None = None

    def splice(self, before: _Block | None, after: _Block | None) -> None:
        """Put this block between `before` and `after`, which are neighbours."""
        self.prev, self.next = before, after
        if before is not None:
            before.next = self
        if after is not None:
            after.prev = self


class CachingAllocatorModel:
    """The allocator's block bookkeeping without the memory: `malloc(nbytes, stream)` returns a handle
    for `free(handle)`; `reserved_bytes` and `allocated_bytes` are the allocator's statistics of those names.

    `expandable_segments=True` models ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (which TorchTitan's
    launch script sets): one segment per pool and stream whose address space is backed by memory in pages
    (2 MiB small pool, 20 MiB large pool) as it grows at its lowest free addresses; any remainder of 512 B
    or more is split off; releasing the cache unmaps the free pages instead of whole segments."""

    def __init__(self, capacity_bytes: int | None = None, expandable_segments: bool = False):
        self.capacity_bytes = capacity_bytes
        self.expandable_segments = expandable_segments
        self.reserved_bytes = 0
        self.allocated_bytes = 0
        self.segments = 0
        self.num_alloc_retries = 0
        self._free: dict[tuple[bool, str], list[tuple[int, int, _Block]]] = {}  # (small, stream) -> by size
        self._unmapped: dict[tuple[bool, str], list[tuple[int, _Block]]] = {}  # (small, stream) -> by address
        self._next_address = 0
        # torch reserves address space for 9/8 of the device's memory per expandable segment
        address_space = (capacity_bytes or 1 << 50) * 9 // 8
        self._address_space = -(-address_space // K_LARGE_BUFFER) * K_LARGE_BUFFER

    def malloc(self, nbytes: int, stream: str = "default", segment_address: int | None = None) -> _Block | None:
        """`segment_address`: where a new segment made for this request starts (cudaMalloc's choice, when it is
        known); by default past every segment so far. Addresses only break best-fit ties between free blocks
        of equal size, so they decide which block is reused, not how many bytes are reserved at the time."""
        if nbytes == 0:
            return None
        size = round_size(nbytes)
        small = size <= K_SMALL_SIZE
        block = self._take_best_fit(small, stream, size) or self._allocate_new(small, stream, size, segment_address)
        remaining = block.size - size
        if remaining >= K_MIN_BLOCK_SIZE if small or self.expandable_segments else remaining > K_SMALL_SIZE:
            rest = _Block(block.address + size, remaining, stream, small, expandable=block.expandable)
            rest.splice(block, block.next)
            block.size = size
            self._insert_free(rest)
        block.allocated = True
        self.allocated_bytes += block.size
        return block

    def free(self, block: _Block | None) -> None:
        if block is None:
            return
        if not block.allocated:
            raise ValueError(f"block at address {block.address} is freed twice")
        block.allocated = False
        self.allocated_bytes -= block.size
        self._merge_neighbours(block)
        self._insert_free(block)

    def release_cached_segments(self) -> None:
        """Give the device back what no tensor uses (``torch.cuda.empty_cache``): every free whole segment, and
        the free pages of expandable segments."""
        for key, blocks in self._free.items():
            kept = []
            for entry in blocks:
                block = entry[2]
                if not block.expandable and block.prev is None and block.next is None:
                    self.reserved_bytes -= block.size
                    self.segments -= 1
                else:
                    kept.append(entry)
            self._free[key] = kept
        for block in [entry[2] for blocks in self._free.values() for entry in blocks if entry[2].expandable]:
            self._unmap(block)

    # --- finding memory ----------------------------------------------------------------------------------

    def _take_best_fit(self, small: bool, stream: str, size: int) -> _Block | None:
        blocks = self._free.get((small, stream), [])
        i = bisect.bisect_left(blocks, (size, -1))
        if i == len(blocks):
            return None
        # Among blocks that fit, an expandable one counts with the unmapped space after it, and the
        # search moves on while the next block could grow less (get_free_block's expandable_size walk).
        while (
            blocks[i][2].expandable
            and i + 1 < len(blocks)
            and self._expandable_size(blocks[i + 1][2]) < self._expandable_size(blocks[i][2])
        ):
            i += 1
        return blocks.pop(i)[2]

    @staticmethod
    def _expandable_size(block: _Block) -> int:
        unmapped_after = block.next.size if block.next is not None and not block.next.mapped else 0
        return block.size + unmapped_after

    def _allocate_new(self, small: bool, stream: str, size: int, address: int | None = None) -> _Block:
        """A block from new device memory; on failure release the cache and retry once, as torch does."""
        if self.expandable_segments:  # its pages are mapped inside address space reserved once, in order
            allocate = self._grow_expandable_segment
        else:
            allocate = functools.partial(self._new_segment, address=address)
        block = allocate(small, stream, size)
        if block is None:
            self.release_cached_segments()
            self.num_alloc_retries += 1
            block = allocate(small, stream, size)
        if block is None:
            wanted = size if self.expandable_segments else segment_size(size)
            raise SimulatedOutOfMemory(size, wanted, self.reserved_bytes, self.allocated_bytes, self.capacity_bytes)
        return block

    def _new_segment(self, small: bool, stream: str, size: int, address: int | None = None) -> _Block | None:
        segment = segment_size(size)
        if not self._fits(segment):
            return None
        address = self._next_address if address is None else address
        block = _Block(address, segment, stream, small)
        self._next_address = max(self._next_address, address + segment)
        self.reserved_bytes += segment
        self.segments += 1
        return block

    def _fits(self, nbytes: int) -> bool:
        return self.capacity_bytes is None or self.reserved_bytes + nbytes <= self.capacity_bytes

    # --- expandable segments -----------------------------------------------------------------------------

    def _grow_expandable_segment(self, small: bool, stream: str, size: int) -> _Block | None:
        """try_allocate_expandable_block: map pages at the lowest addresses that can hold `size`."""
        candidate = self._find_expandable_space(small, stream, size)
        if not candidate.mapped and not self._map(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:  # a free mapped block followed by unmapped space
            following = candidate.next
            if not self._map(following, min(size - candidate.size, following.size)):
                return None
            candidate = following  # it took the free block before it in when mapped
        self._remove_free(candidate)
        return candidate

    def _find_expandable_space(self, small: bool, stream: str, size: int) -> _Block:
        def allocatable(block: _Block | None) -> bool:
            return block is not None and not block.allocated

        def has_room(block: _Block | None) -> bool:
            room = 0
            while room < size and allocatable(block):
                room += block.size
                block = block.next
            return room >= size

        for _, unmapped in self._unmapped.get((small, stream), []):
            start = unmapped.prev if allocatable(unmapped.prev) else unmapped
            if has_room(start):
                return start
        segment = _Block(self._next_address, self._address_space, stream, small, mapped=False, expandable=True)
        self._next_address += self._address_space
        self.segments += 1
        self._insert_unmapped(segment)
        return segment

    def _map(self, block: _Block, size: int) -> bool:
        page = K_SMALL_BUFFER if block.small else K_LARGE_BUFFER
        mapped = min(-(-size // page) * page, block.size)
        if not self._fits(mapped):
            return False
        self._remove_unmapped(block)
        block.mapped = True
        if mapped < block.size:
            rest = _Block(block.address + mapped, block.size - mapped, block.stream, block.small, mapped=False)
            rest.expandable = True
            rest.splice(block, block.next)
            self._insert_unmapped(rest)
            block.size = mapped
        self._merge_neighbours(block)
        self._insert_free(block)
        self.reserved_bytes += mapped
        return True

    def _unmap(self, block: _Block) -> None:
        """unmap_block: give back the whole pages inside a free block; its ragged ends stay mapped and free."""
        page = K_SMALL_BUFFER if block.small else K_LARGE_BUFFER
        begin = -(-block.address // page) * page
        end = (block.address + block.size) // page * page
        if begin >= end:
            return
        self._remove_free(block)
        if begin > block.address:
            before = _Block(block.address, begin - block.address, block.stream, block.small, expandable=True)
            before.splice(block.prev, block)
            self._insert_free(before)
        if end < block.address + block.size:
            after = _Block(end, block.address + block.size - end, block.stream, block.small, expandable=True)
            after.splice(block, block.next)
            self._insert_free(after)
        block.address, block.size, block.mapped = begin, end - begin, False
        self.reserved_bytes -= end - begin
        self._merge_neighbours(block)
        if block.prev is None and block.next is None:  # the whole segment is unmapped: it goes too
            self.segments -= 1
        else:
            self._insert_unmapped(block)

    # --- block lists -------------------------------------------------------------------------------------

    def _merge_neighbours(self, block: _Block) -> None:
        """try_merge_blocks with the previous and next block: free ones of the same mapped state join it."""
        for neighbour in (block.prev, block.next):
            if neighbour is None or neighbour.allocated or neighbour.mapped != block.mapped:
                continue
            if neighbour.mapped:
                self._remove_free(neighbour)
            else:
                self._remove_unmapped(neighbour)
            if neighbour is block.prev:
                block.address = neighbour.address
                block.splice(neighbour.prev, block.next)
            else:
                block.splice(block.prev, neighbour.next)
            block.size += neighbour.size

    def _insert_free(self, block: _Block) -> None:
        bisect.insort(self._free.setdefault((block.small, block.stream), []), (block.size, block.address, block))

    def _remove_free(self, block: _Block) -> None:
        blocks = self._free[(block.small, block.stream)]
        i = bisect.bisect_left(blocks, (block.size, block.address))
        assert blocks[i][2] is block, "free-block index out of sync with the segment lists"
        del blocks[i]

    def _insert_unmapped(self, block: _Block) -> None:
        bisect.insort(self._unmapped.setdefault((block.small, block.stream), []), (block.address, block))

    def _remove_unmapped(self, block: _Block) -> None:
        blocks = self._unmapped[(block.small, block.stream)]
        i = bisect.bisect_left(blocks, (block.address,))
        assert blocks[i][1] is block, "unmapped-block index out of sync with the segment lists"
        del blocks[i]


@dataclass(frozen=True)
class ReplayResult:
    peak_reserved: Peak  # the reserved (segment) bytes peak and the event where it happens
    peak_allocated: Peak  # the allocated (rounded block) bytes peak
    segments: int  # number of segments at the reserved peak


def replay(
    events: Iterable[AllocEvent], capacity_bytes: int | None = None, expandable_segments: bool = False
) -> ReplayResult:
    """Run an alloc/free trace through the allocator model; raises `SimulatedOutOfMemory` past the capacity."""
    allocator = CachingAllocatorModel(capacity_bytes, expandable_segments)
    handles: dict[int, _Block | None] = {}
    peak_reserved = peak_allocated = Peak(0, "", "", -1)
    segments_at_peak = 0
    for index, event in enumerate(events):
        if event.action == "alloc":
            if event.block in handles:
                raise ValueError(f"event {index}: block {event.block} is allocated twice")
            handles[event.block] = allocator.malloc(event.nbytes, event.stream)
        elif event.action == "free":
            if event.block not in handles:
                raise ValueError(f"event {index}: block {event.block} is freed but was never allocated")
            allocator.free(handles.pop(event.block))
        else:
            raise ValueError(f"event {index}: action={event.action!r}; expected 'alloc' or 'free'")
        if allocator.reserved_bytes > peak_reserved.bytes:
            peak_reserved = Peak(allocator.reserved_bytes, event.op, event.phase, index)
            segments_at_peak = allocator.segments
        if allocator.allocated_bytes > peak_allocated.bytes:
            peak_allocated = Peak(allocator.allocated_bytes, event.op, event.phase, index)
    return ReplayResult(peak_reserved, peak_allocated, segments_at_peak)
