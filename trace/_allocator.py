"""Replay of a step's allocations through a model of PyTorch's CUDA caching allocator.

The tracer (_step.Tracker, `events` on) logs every device storage made, resized and freed, in
order. Replaying that log through the native caching allocator's rules (no expandable segments,
default PYTORCH_CUDA_ALLOC_CONF) gives what the allocator reserves from the device
(torch.cuda.max_memory_reserved), so the gap between allocated and reserved (fragmentation) is
derived rather than guessed.

Source: c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator (pytorch/pytorch, read at
commit 001074d25084fdb87a799823e395a50f5ec044d3, a torch 2.x main):

- round_size: sizes below kMinBlockSize (512) become 512, others round up to a multiple of 512
  (roundup_power2_divisions off by default);
- get_pool: size <= kSmallSize (1 MiB) uses the small pool, else the large pool;
- get_allocation_size: a new segment (cudaMalloc) is kSmallBuffer (2 MiB) for a small request,
  kLargeBuffer (20 MiB) for a request under kMinLargeAlloc (10 MiB), else the request rounded up
  to kRoundLarge (2 MiB);
- get_free_block: pool.blocks.lower_bound(search_key) over BlockComparatorSize (stream, size,
  address): the smallest cached block that fits, the lowest address among equal sizes (the
  max_split_size checks never fire at the default max_split_size = SIZE_MAX);
- should_split: small pool: remaining >= kMinBlockSize; large pool: remaining > kSmallSize;
  alloc_found_block keeps the front of the block and caches the remainder;
- free_block / try_merge_blocks: a freed block merges with its free neighbours in the segment;
- malloc: get_free_block, else alloc_block (cudaMalloc), else (release_available_cached_blocks
  does nothing at the default max_split_size) release_cached_blocks, which frees every cached
  block that is a whole segment (no prev, no next) in both pools, and alloc_block again; then
  OutOfMemoryError. Segments are never returned otherwise (no empty_cache).

Not modelled: streams (each block belongs to its allocation stream; FSDP2's all-gather and
reduce-scatter streams have pools of their own in effect), record_stream / event-deferred frees,
expandable segments, max_split_size, garbage_collection_threshold, CUDA graph private pools,
allocations that bypass the tracer (kernel workspaces, NCCL buffers).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from typing import Any

MIN_BLOCK = 512
"""kMinBlockSize: all sizes are rounded to at least 512 bytes."""
SMALL_SIZE = 1 << 20
"""kSmallSize: the largest "small" allocation is 1 MiB."""
SMALL_BUFFER = 2 << 20
"""kSmallBuffer: "small" allocations are packed in 2 MiB segments."""
LARGE_BUFFER = 20 << 20
"""kLargeBuffer: allocations between 1 and 10 MiB are packed in 20 MiB segments."""
MIN_LARGE_ALLOC = 10 << 20
"""kMinLargeAlloc: allocations from 10 MiB get a segment of their own size."""
ROUND_LARGE = 2 << 20
"""kRoundLarge: large segments are rounded up to 2 MiB."""

ALLOC = "alloc"
"""Event (ALLOC, storage id, bytes, phase): a storage made."""
FREE = "free"
"""Event (FREE, storage id): a storage freed."""
RESIZE = "resize"
"""Event (RESIZE, storage id, new bytes, phase): a storage resized (new block, then the old one
freed, as storage_resize_ does; 0 bytes frees it)."""


def round_size(size: int) -> int:
    """CUDACachingAllocator.cpp round_size: bytes of the block serving a request of `size`."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    return -(-size // MIN_BLOCK) * MIN_BLOCK


def allocation_size(size: int) -> int:
    """CUDACachingAllocator.cpp get_allocation_size: bytes of the segment cudaMalloc'd for a
    (rounded) request of `size` that no cached block serves."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class _Block:
    __slots__ = ("ptr", "size", "small", "allocated", "prev", "next")

    def __init__(self, ptr: int, size: int, small: bool) -> None:
        self.ptr = ptr
        self.size = size
        self.small = small
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None


class CachingAllocator:
    """One device's native caching allocator (one stream), sizes only.

    capacity: bytes cudaMalloc may hand out in all (None: unlimited); a segment that would go
    over it first makes the allocator release its fully free cached segments and retry, as
    malloc does before raising OutOfMemoryError; if it still does not fit, `ooms` counts it and
    the segment is made anyway so that the replay goes on.
    """

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self.free_lists: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
        self.free_blocks: dict[int, _Block] = {}  # ptr -> cached (free) block
        self.next_address = 1 << 40
        self.allocated = 0
        self.reserved = 0
        self.segments = 0
        self.releases = 0
        self.ooms = 0

    def _insert(self, block: _Block) -> None:
        insort(self.free_lists[block.small], (block.size, block.ptr))
        self.free_blocks[block.ptr] = block

    def _remove(self, block: _Block) -> None:
        lst = self.free_lists[block.small]
        del lst[bisect_left(lst, (block.size, block.ptr))]
        del self.free_blocks[block.ptr]

    def largest_free_block(self) -> int:
        """Bytes of the largest cached free block (either pool)."""
        return max((lst[-1][0] for lst in self.free_lists.values() if lst), default=0)

    def release_cached_blocks(self) -> int:
        """release_cached_blocks: return every cached block that is a whole segment; bytes."""
        whole = [b for b in self.free_blocks.values() if b.prev is None and b.next is None]
        for block in whole:
            self._remove(block)
            self.reserved -= block.size
            self.segments -= 1
        self.releases += 1
        return sum(b.size for b in whole)

    def malloc(self, size: int) -> _Block:
        """A block for a request of `size` bytes (size > 0)."""
        size = round_size(size)
        small = size <= SMALL_SIZE
        lst = self.free_lists[small]
        i = bisect_left(lst, (size, -1))
        if i < len(lst):
            block = self.free_blocks[lst[i][1]]
            self._remove(block)
        else:
            segment = allocation_size(size)
            if self.capacity is not None and self.reserved + segment > self.capacity:
                self.release_cached_blocks()
                if self.reserved + segment > self.capacity:
                    self.ooms += 1
            block = _Block(self.next_address, segment, small)
            self.next_address += segment
            self.reserved += segment
            self.segments += 1
        remaining = block.size - size
        if remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE:
            rest = _Block(block.ptr + size, remaining, small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._insert(rest)
        block.allocated = True
        self.allocated += block.size
        return block

    def free(self, block: _Block) -> None:
        """free_block: cache `block`, merged with its free neighbours."""
        block.allocated = False
        self.allocated -= block.size
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.allocated:
            self._remove(prev)
            block.ptr = prev.ptr
            block.size += prev.size
            block.prev = prev.prev
            if block.prev is not None:
                block.prev.next = block
        if nxt is not None and not nxt.allocated:
            self._remove(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if block.next is not None:
                block.next.prev = block
        self._insert(block)


class _Peaks:
    """The peaks a replay counts (from reset_peak_at on), and the allocator's state when
    reserved last rose to its peak: the fragmentation that made it."""

    __slots__ = ("reserved_bytes", "allocated_bytes", "num_segments", "largest_free_block_bytes")

    def __init__(self) -> None:
        self.reserved_bytes = self.allocated_bytes = -1
        self.num_segments = self.largest_free_block_bytes = 0

    def note(self, alloc: CachingAllocator) -> None:
        """Count the allocator's state now."""
        if alloc.reserved > self.reserved_bytes:
            self.reserved_bytes = alloc.reserved
            self.num_segments = alloc.segments
            self.largest_free_block_bytes = alloc.largest_free_block()
        self.allocated_bytes = max(self.allocated_bytes, alloc.allocated)


def _replay_event(
    alloc: CachingAllocator,
    live: dict[Any, _Block],
    event: tuple[Any, ...],
    *,
    peaks: _Peaks | None,
) -> None:
    """One logged event through `alloc`; `live` maps each storage id to its block. A resize
    takes its new block before it frees the old one (storage_resize_), so the old block cannot
    serve it; `peaks` (None: not counting yet) notes the state after each new block."""
    kind, key = event[0], event[1]
    if kind == FREE:
        block = live.pop(key, None)
        if block is not None:
            alloc.free(block)
        return
    if kind not in (ALLOC, RESIZE):
        raise ValueError(f"allocator event: unknown kind {kind!r}")
    old = live.pop(key, None) if kind == RESIZE else None
    if event[2] > 0:
        live[key] = alloc.malloc(event[2])
        if peaks is not None:
            peaks.note(alloc)
    if old is not None:
        alloc.free(old)


def simulate_reserved(
    events: Iterable[tuple[Any, ...]],
    *,
    capacity: int | None = None,
    reset_peak_at: int = 0,
    workspace_bytes: int = 0,
    workspace_at: int = 0,
) -> dict[str, int]:
    """Replay an allocation log through the caching allocator; what it reserved.

    Args:
        events: (ALLOC, id, bytes, phase), (FREE, id) and (RESIZE, id, new bytes, phase) tuples in
            program order (Tracker.events). Zero-byte storages hold no block.
        capacity: bytes the allocator may reserve (device memory less the CUDA context and
            anything else on it); None: unlimited.
        reset_peak_at: the index of the event before which torch.cuda.reset_peak_memory_stats
            ran: the peaks count from the state there on (0: the whole log).
        workspace_bytes: bytes allocated once and never freed, outside the log (the cuBLAS
            workspaces, 64 MiB on sm90, made at the first matmul); 0: none.
        workspace_at: the index of the event before which the workspace is allocated (where the
            first matmul ran); a cached free block may serve it, as any request.

    Returns:
        peak_reserved_bytes and peak_allocated_bytes (from reset_peak_at on), reserved_at_end_bytes,
        allocated_at_end_bytes, num_segments (at the end), num_segments_at_peak,
        largest_free_block_at_peak_bytes (the largest cached free block when reserved last rose
        to its peak), num_releases (release_cached_blocks calls) and num_ooms (segments made
        over `capacity` even after releasing).
    """
    alloc = CachingAllocator(capacity)
    live: dict[Any, _Block] = {}
    peaks = _Peaks()
    counting: _Peaks | None = None
    for index, event in enumerate(events):
        if index == workspace_at and workspace_bytes:
            alloc.malloc(workspace_bytes)
        if index == reset_peak_at:
            counting = peaks
            peaks.note(alloc)
        _replay_event(alloc, live, event, peaks=counting)
    peaks.note(alloc)
    return {
        "peak_reserved_bytes": peaks.reserved_bytes,
        "peak_allocated_bytes": peaks.allocated_bytes,
        "reserved_at_end_bytes": alloc.reserved,
        "allocated_at_end_bytes": alloc.allocated,
        "num_segments": alloc.segments,
        "num_segments_at_peak": peaks.num_segments,
        "largest_free_block_at_peak_bytes": peaks.largest_free_block_bytes,
        "num_releases": alloc.releases,
        "num_ooms": alloc.ooms,
    }
