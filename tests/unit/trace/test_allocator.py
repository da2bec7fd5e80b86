"""trace/_allocator.py: the caching allocator replay on hand-made allocation logs."""

from __future__ import annotations

import pytest

from trainmem.trace._allocator import (
    ALLOC,
    FREE,
    RESIZE,
    CachingAllocator,
    allocation_size,
    round_size,
    simulate_reserved,
)

KIB = 1 << 10
MIB = 1 << 20


def _run(*events, **kwargs):
    return simulate_reserved(list(events), **kwargs)


def test_rounding_and_segment_sizes():
    assert round_size(1) == 512
    assert round_size(512) == 512
    assert round_size(513) == 1024
    assert allocation_size(512) == 2 * MIB  # small pool: kSmallBuffer
    assert allocation_size(MIB) == 2 * MIB  # kSmallSize is still small
    assert allocation_size(MIB + 512) == 20 * MIB  # 1 to 10 MiB: kLargeBuffer
    assert allocation_size(10 * MIB - 512) == 20 * MIB
    assert allocation_size(10 * MIB) == 10 * MIB  # kMinLargeAlloc: its own size
    assert allocation_size(11 * MIB + 512) == 12 * MIB  # rounded up to kRoundLarge


def test_freed_block_is_reused():
    out = _run((ALLOC, 1, 12 * MIB, "f"), (FREE, 1), (ALLOC, 2, 12 * MIB, "f"))
    assert out["peak_reserved_bytes"] == 12 * MIB
    assert out["num_segments"] == 1
    assert out["allocated_at_end_bytes"] == 12 * MIB


def test_too_small_freed_block_forces_a_new_segment():
    out = _run((ALLOC, 1, 12 * MIB, "f"), (FREE, 1), (ALLOC, 2, 14 * MIB, "f"))
    assert out["peak_reserved_bytes"] == 26 * MIB
    assert out["num_segments"] == 2
    assert out["largest_free_block_at_peak_bytes"] == 12 * MIB


def test_best_fit_takes_the_smallest_block_that_fits():
    out = _run(
        (ALLOC, 1, 14 * MIB, "f"),
        (ALLOC, 2, 12 * MIB, "f"),
        (FREE, 1),
        (FREE, 2),
        (ALLOC, 3, 12 * MIB, "f"),  # the 12 MiB block, not the 14 MiB one
        (ALLOC, 4, 14 * MIB, "f"),  # so the 14 MiB one is still there
    )
    assert out["peak_reserved_bytes"] == 26 * MIB


def test_large_block_split_when_more_than_1_mib_remains():
    out = _run(
        (ALLOC, 1, 20 * MIB, "f"),
        (FREE, 1),
        (ALLOC, 2, 12 * MIB, "f"),  # 8 MiB remain: split
        (ALLOC, 3, 6 * MIB, "f"),  # from the 8 MiB remainder (2 MiB remain: split again)
    )
    assert out["peak_reserved_bytes"] == 20 * MIB
    assert out["allocated_at_end_bytes"] == 18 * MIB


def test_large_block_not_split_when_1_mib_or_less_remains():
    out = _run((ALLOC, 1, 20 * MIB, "f"), (FREE, 1), (ALLOC, 2, 19 * MIB, "f"))
    assert out["allocated_at_end_bytes"] == 20 * MIB  # the whole block is handed out
    out = _run(
        (ALLOC, 1, 20 * MIB, "f"), (FREE, 1), (ALLOC, 2, 19 * MIB, "f"), (ALLOC, 3, MIB, "f")
    )
    assert out["peak_reserved_bytes"] == 22 * MIB  # 1 MiB is small: a 2 MiB small segment


def test_freed_neighbours_merge():
    events = [
        (ALLOC, 1, 20 * MIB, "f"),
        (FREE, 1),
        (ALLOC, 2, 8 * MIB, "f"),
        (ALLOC, 3, 8 * MIB, "f"),
        (FREE, 2),
        (FREE, 3),  # merges with 2 before it and the 4 MiB remainder after it
        (ALLOC, 4, 18 * MIB, "f"),
    ]
    out = simulate_reserved(events)
    assert out["peak_reserved_bytes"] == 20 * MIB
    assert out["num_segments"] == 1
    # freed out of order, the middle block merges with both sides
    alloc = CachingAllocator()
    a, b, c = (alloc.malloc(6 * MIB) for _ in range(3))  # one 20 MiB segment, 2 MiB left
    assert alloc.reserved == 20 * MIB
    alloc.free(a)
    alloc.free(c)
    assert alloc.largest_free_block() == 8 * MIB  # c and the 2 MiB tail
    alloc.free(b)
    assert alloc.largest_free_block() == 20 * MIB
    assert len(alloc.free_blocks) == 1


def test_small_and_large_pools_are_separate():
    out = _run((ALLOC, 1, 512 * KIB, "f"), (FREE, 1), (ALLOC, 2, MIB + 512, "f"))
    assert out["peak_reserved_bytes"] == 2 * MIB + 20 * MIB
    # small requests pack a 2 MiB segment down to the last 512 bytes
    out = _run(*((ALLOC, i, 512 * KIB, "f") for i in range(4)), (ALLOC, 9, 100, "f"))
    assert out["peak_reserved_bytes"] == 4 * MIB
    assert out["allocated_at_end_bytes"] == 2 * MIB + 512


def test_mid_size_requests_share_a_20_mib_segment():
    out = _run(*((ALLOC, i, 3 * MIB, "f") for i in range(6)))
    assert out["peak_reserved_bytes"] == 20 * MIB
    assert out["num_segments"] == 1
    out = _run(*((ALLOC, i, 3 * MIB, "f") for i in range(7)))  # 2 MiB left: a second one
    assert out["peak_reserved_bytes"] == 40 * MIB


def test_capacity_releases_whole_free_segments_first():
    out = _run((ALLOC, 1, 20 * MIB, "f"), (FREE, 1), (ALLOC, 2, 30 * MIB, "f"), capacity=40 * MIB)
    assert out["reserved_at_end_bytes"] == 30 * MIB
    assert out["peak_reserved_bytes"] == 30 * MIB
    assert out["num_releases"] == 1
    assert out["num_ooms"] == 0
    # a segment still partly in use is not released: out of memory
    out = _run(
        (ALLOC, 1, 20 * MIB, "f"),
        (FREE, 1),
        (ALLOC, 2, 12 * MIB, "f"),
        (ALLOC, 3, 30 * MIB, "f"),
        capacity=40 * MIB,
    )
    assert out["num_releases"] == 1
    assert out["num_ooms"] == 1
    assert out["reserved_at_end_bytes"] == 50 * MIB


def test_resize_allocates_new_then_frees_old():
    out = _run(
        (ALLOC, 1, 0, "f"),  # zero bytes: no block
        (RESIZE, 1, 12 * MIB, "f"),
        (RESIZE, 1, 0, "f"),
        (ALLOC, 2, 12 * MIB, "f"),
        (FREE, 2),
    )
    assert out["peak_reserved_bytes"] == 12 * MIB
    assert out["peak_allocated_bytes"] == 12 * MIB
    out = _run((ALLOC, 1, 12 * MIB, "f"), (RESIZE, 1, 12 * MIB, "f"))  # both alive at once
    assert out["peak_reserved_bytes"] == 24 * MIB


def test_peaks_count_from_the_reset():
    events = [(ALLOC, 1, 40 * MIB, "w"), (FREE, 1), (ALLOC, 2, 12 * MIB, "f")]
    out = simulate_reserved(events, reset_peak_at=2)
    assert out["peak_reserved_bytes"] == 40 * MIB  # reserved is kept
    assert out["peak_allocated_bytes"] == 12 * MIB
    out = simulate_reserved(events, workspace_bytes=64 * MIB)
    assert out["peak_reserved_bytes"] == 104 * MIB


def test_workspace_may_come_from_a_cached_block():
    events = [(ALLOC, 1, 100 * MIB, "setup"), (FREE, 1), (ALLOC, 2, 12 * MIB, "forward")]
    out = simulate_reserved(events, workspace_bytes=64 * MIB, workspace_at=2, reset_peak_at=2)
    assert out["peak_reserved_bytes"] == 100 * MIB  # 64 + 12 MiB carved from the freed 100 MiB
    assert out["peak_allocated_bytes"] == 76 * MIB


def test_unknown_event_kind():
    with pytest.raises(ValueError, match="unknown kind"):
        _run(("oops", 1))


def test_many_events_are_fast():
    import time

    events = []
    for i in range(50_000):
        events.append((ALLOC, i, (i % 97 + 1) * 300 * KIB, "f"))
        if i >= 50:
            events.append((FREE, i - 50))
    started = time.perf_counter()
    out = simulate_reserved(events)
    assert time.perf_counter() - started < 10.0
    assert out["peak_reserved_bytes"] >= out["peak_allocated_bytes"]


def test_tracker_logs_allocations_and_frees():
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trainmem.trace._step import Tracker

    quiet = Tracker("cpu")
    assert quiet.events is None
    tracker = Tracker("cpu")
    tracker.events = []
    with FakeTensorMode(), tracker:
        tracker.phase = "forward"
        a = torch.empty(1000)
        b = a + 1
        del a
        c = b.view(-1)  # a view: no new storage
        storage = b.untyped_storage()
        storage.resize_(0)
        del b, c, storage
    kinds = [e[0] for e in tracker.events]
    assert kinds.count("alloc") == 2
    assert ("alloc", 1, 4096, "forward") in tracker.events
    assert ("free", 1) in tracker.events
    assert ("resize", 2, 0, "forward") in tracker.events
    out = simulate_reserved(tracker.events)
    assert out["peak_allocated_bytes"] == 8192
    assert out["peak_reserved_bytes"] == 2 * MIB
