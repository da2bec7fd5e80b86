"""The step timeline (report/_timeline.py) as PyTorch's memory snapshot: what
`torch.cuda.memory._snapshot()` returns, so that torch's own viewer draws a prediction beside a
real step (`python -m torch.cuda._memory_viz trace_plot FILE -o out.html`, or
https://pytorch.org/memory_viz).

The moments become allocations and frees on one device and stream: between two moments each
component frees what it loses (latest first) and then allocates what it gains, so that the
bytes alive after each moment are the timeline's total and never more in between: the trace's
peak is `peak_allocated_bytes`. Addresses come from a first-fit allocator over one segment
(its segment_alloc first) as large as that peak or the highest address reached; the blocks
alive at the end are the segment's active blocks. No torch is
imported (it is an optional extra); the dict is plain Python, pickled as it is.
Source: torch/cuda/memory.py (_snapshot's Segment, Block, TraceEntry, Frame) and
torch/cuda/_memory_viz.py (trace, segsum, trace_plot: the fields they read), torch 2.13.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._timeline import TIMELINE_COMPONENTS

SEGMENT_ADDRESS = 1 << 40
"""Where the one segment starts (any nonzero device address; torch's are of this order)."""


class _FirstFit:
    """Addresses for allocations in one segment: the lowest free gap that holds the size."""

    def __init__(self) -> None:
        self.live: dict[int, int] = {}  # offset -> size
        self.extent = 0  # the highest end any allocation reached: the segment's size

    def alloc(self, size: int) -> int:
        offset = 0
        for start in sorted(self.live):
            if start - offset >= size:
                break
            offset = max(offset, start + self.live[start])
        self.live[offset] = size
        self.extent = max(self.extent, offset + size)
        return offset

    def free(self, offset: int) -> None:
        del self.live[offset]


def _segment_size(timeline: Mapping[str, Any]) -> int:
    """The segment's size: the step's peak (first fit may reach higher; the larger is kept)."""
    return max(int(max(timeline["total_bytes"])), 1)


def _frame(component: str, moment: str) -> dict[str, Any]:
    """The one stack frame an event shows: the component and the moment (trainmem's words)."""
    return {"filename": f"trainmem: {moment}", "line": 0, "name": component}


def _event(action: str, addr: int, size: int, frames: list[dict[str, Any]]) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames}


def _trace(timeline: Mapping[str, Any]) -> tuple[list[dict[str, Any]], _FirstFit, dict]:
    """(the device trace, the allocator at the end, each live offset's frames)."""
    heap, events = _FirstFit(), []
    stacks: dict[str, list[tuple[int, int]]] = {k: [] for k in TIMELINE_COMPONENTS}
    frames_of: dict[int, list[dict[str, Any]]] = {}
    alive = dict.fromkeys(TIMELINE_COMPONENTS, 0)
    for i, moment in enumerate(timeline["moments"]):
        want = {k: int(timeline[k][i]) for k in TIMELINE_COMPONENTS}
        for k in TIMELINE_COMPONENTS:  # frees first: never more alive than either moment
            while alive[k] > want[k]:  # latest first; freeing too much is allocated back below
                offset, size = stacks[k].pop()
                for action in ("free_requested", "free_completed"):
                    events.append(_event(action, SEGMENT_ADDRESS + offset, size, frames_of[offset]))
                heap.free(offset)
                alive[k] -= size
        for k in TIMELINE_COMPONENTS:
            size = want[k] - alive[k]
            if size > 0:
                offset = heap.alloc(size)
                frames_of[offset] = [_frame(k, moment)]
                stacks[k].append((offset, size))
                events.append(_event("alloc", SEGMENT_ADDRESS + offset, size, frames_of[offset]))
                alive[k] += size
    return events, heap, frames_of


def _block(offset: int, size: int, frames: list[dict[str, Any]] | None) -> dict[str, Any]:
    """A segment's block: allocated (with its frames) or, `frames` None, a free gap."""
    return {
        "address": SEGMENT_ADDRESS + offset,
        "size": size,
        "requested_size": 0 if frames is None else size,
        "state": "inactive" if frames is None else "active_allocated",
        "frames": frames or [],
    }


def memory_snapshot(timeline: Mapping[str, Any]) -> dict[str, Any]:
    """The timeline as a torch memory snapshot dict: `segments` (one, as large as the trace's
    highest address, with the blocks alive at the step's end) and `device_traces` (device 0's
    alloc / free_requested / free_completed events)."""
    events, heap, frames_of = _trace(timeline)
    total_size = max(heap.extent, _segment_size(timeline))
    events.insert(0, _event("segment_alloc", SEGMENT_ADDRESS, total_size, []))
    blocks, offset = [], 0
    for start in sorted(heap.live):
        if start > offset:
            blocks.append(_block(offset, start - offset, None))
        blocks.append(_block(start, heap.live[start], frames_of[start]))
        offset = start + heap.live[start]
    if offset < total_size:
        blocks.append(_block(offset, total_size - offset, None))
    allocated = sum(heap.live.values())
    segment = {
        "device": 0,
        "address": SEGMENT_ADDRESS,
        "total_size": total_size,
        "allocated_size": allocated,
        "active_size": allocated,
        "requested_size": allocated,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "blocks": blocks,
    }
    return {"segments": [segment], "device_traces": [events]}
