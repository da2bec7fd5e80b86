"""What the tracer saw, as a PyTorch memory snapshot: the dict `torch.cuda.memory._snapshot()`
returns after `_record_memory_history()` (pickled as `_dump_snapshot` writes it), so that torch's
viewer (pytorch.org/memory_viz) and `trainmem explain` read a traced step as they read a real
one.

Frames: each allocation's Python stack where the tracker saw its storage made, innermost first,
as torch's recorder writes it (filename, line, name), without the tracker's own dispatch
frames. An allocation made on the autograd engine's device thread (backward on a CUDA device)
has no Python caller; torch's recorder shows the C++ frames of that thread there
(`_record_memory_history(stacks="all")`, the default), and so does this: AUTOGRAD_THREAD_FRAMES
below the Python frames that thread runs (checkpoint's recompute).

Addresses, segments and the segment_alloc / segment_free entries come from replaying the
allocation log through trace/_allocator.py's model of the native caching allocator.
Source: torch/cuda/memory.py (_snapshot's TypedDicts), torch/csrc/cuda/memory_snapshot.cpp (the
keys it writes), torch 2.13.
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
import threading
from collections.abc import Iterable
from types import FrameType
from typing import Any

from ._allocator import ALLOC, FREE, RESIZE, CachingAllocator, _Block

AUTOGRAD_THREAD_FRAMES = (
    (
        "??",
        0,
        "torch::autograd::Engine::evaluate_function(std::shared_ptr<GraphTask>&, "
        "torch::autograd::Node*, torch::autograd::InputBuffer&, "
        "std::shared_ptr<ReadyQueue> const&)",
    ),
    ("??", 0, "torch::autograd::Engine::thread_main(std::shared_ptr<GraphTask> const&)"),
    (
        "??",
        0,
        "torch::autograd::Engine::thread_init(int, std::shared_ptr<ReadyQueue> const&, bool)",
    ),
)
"""The C++ frames of an allocation on the autograd engine's device thread (torch/csrc/autograd/
engine.cpp: thread_init -> thread_main -> evaluate_function), as the recorder names them."""
_SKIPPED = ("torch/_dynamo/eval_frame.py", "torch/_compile.py", "torch/utils/_python_dispatch.py")
"""Files of the dispatch machinery between an op's caller and the tracker."""
_TRACKER = os.path.join("trace", "_step.py")
MAX_FRAMES = 64
"""Python frames kept per allocation (torch keeps the whole stack; the innermost 64 say it)."""


class FrameRecorder:
    """Each allocation's frames, by the tracker's sequence number; equal frames shared (one
    dict per distinct frame, so that the pickle stays small)."""

    def __init__(self) -> None:
        self.frames: dict[int, list[dict[str, Any]]] = {}
        self._frame_dicts: dict[tuple[str, int, str], dict[str, Any]] = {}

    def _frame(self, filename: str, line: int, name: str) -> dict[str, Any]:
        key = (filename, line, name)
        found = self._frame_dicts.get(key)
        if found is None:
            found = self._frame_dicts[key] = {"filename": filename, "line": line, "name": name}
        return found

    def record(self, sequence: int) -> None:
        """The caller's stack for allocation `sequence` (call from the tracker)."""
        frame: FrameType | None = sys._getframe(1)
        out: list[dict[str, Any]] = []
        leading = True
        while frame is not None and len(out) < MAX_FRAMES:
            filename = frame.f_code.co_filename
            if leading and (filename.endswith(_TRACKER) or filename.endswith(_SKIPPED)):
                frame = frame.f_back
                continue
            leading = False
            out.append(self._frame(filename, frame.f_lineno, frame.f_code.co_name))
            frame = frame.f_back
        if threading.current_thread() is not threading.main_thread():
            out += [self._frame(*f) for f in AUTOGRAD_THREAD_FRAMES]
        self.frames[sequence] = out


class _RecordingAllocator(CachingAllocator):
    """The caching allocator model, with its segments kept (address -> bytes) and the segment
    events it makes logged."""

    def __init__(self) -> None:
        super().__init__()
        self.segment_bytes: dict[int, int] = {}
        self.entries: list[dict[str, Any]] = []

    def malloc(self, size: int) -> _Block:
        before = self.next_address
        block = super().malloc(size)
        if self.next_address != before:  # a new segment (cudaMalloc) at `before`
            total = self.next_address - before
            self.segment_bytes[before] = total
            self.entries.append(_entry("segment_alloc", before, total, []))
        return block

    def release_cached_blocks(self) -> int:
        for block in self.free_blocks.values():
            if block.prev is None and block.next is None:
                self.entries.append(_entry("segment_free", block.ptr, block.size, []))
                self.segment_bytes.pop(block.ptr, None)
        return super().release_cached_blocks()


def _entry(action: str, addr: int, size: int, frames: list[dict[str, Any]]) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames}


def _segments(
    alloc: _RecordingAllocator, live: dict[Any, _Block], frames: dict[Any, list]
) -> list[dict[str, Any]]:
    """The segments at the end, each with its blocks (allocated with their frames, or free)."""
    owner = {id(b): key for key, b in live.items()}
    blocks = [*live.values(), *alloc.free_blocks.values()]
    out = []
    for address in sorted(alloc.segment_bytes):
        total = alloc.segment_bytes[address]
        inside = sorted((b for b in blocks if address <= b.ptr < address + total), key=_ptr)
        listed, allocated = [], 0
        for b in inside:
            key = owner.get(id(b))
            if b.allocated:
                allocated += b.size
            listed.append(
                {
                    "address": b.ptr,
                    "size": b.size,
                    "requested_size": b.size if b.allocated else 0,
                    "state": "active_allocated" if b.allocated else "inactive",
                    "frames": frames.get(key, []) if b.allocated else [],
                }
            )
        out.append(
            {
                "device": 0,
                "address": address,
                "total_size": total,
                "allocated_size": allocated,
                "active_size": allocated,
                "requested_size": allocated,
                "stream": 0,
                "segment_type": "small" if inside and inside[0].small else "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": listed,
            }
        )
    return out


def _ptr(block: _Block) -> int:
    return block.ptr


def snapshot_of(
    events: Iterable[tuple[Any, ...]], frames: dict[Any, list[dict[str, Any]]]
) -> dict[str, Any]:
    """The allocation log (Tracker.events) as a torch memory snapshot dict: device 0's trace
    (segment_alloc, alloc, free_requested, free_completed, segment_free; time_us counting the
    entries) and the segments left at the end."""
    alloc = _RecordingAllocator()
    live: dict[Any, _Block] = {}
    trace = alloc.entries

    def free(key: Any, block: _Block) -> None:
        for action in ("free_requested", "free_completed"):
            trace.append(_entry(action, block.ptr, block.size, frames.get(key, [])))
        alloc.free(block)

    for event in events:
        kind, key = event[0], event[1]
        if kind == FREE:
            if key in live:
                free(key, live.pop(key))
            continue
        old = live.pop(key, None) if kind == RESIZE else None
        if event[2] > 0:  # a resize takes its new block before the old one is freed
            block = live[key] = alloc.malloc(event[2])
            trace.append(_entry(ALLOC, block.ptr, event[2], frames.get(key, [])))
        if old is not None:
            free(key, old)
    for k, entry in enumerate(trace):
        entry["time_us"] = k
    return {
        "segments": _segments(alloc, live, frames),
        "device_traces": [trace],
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "",
            "max_split_size": -1,
            "garbage_collection_threshold": 0.0,
            "expandable_segments": False,
            "pinned_num_register_threads": 1,
            "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False,
            "roundup_power2_divisions": {},
        },
    }


def write_snapshot(path: str, snapshot: dict[str, Any]) -> None:
    """`snapshot` pickled at `path` as `torch.cuda.memory._dump_snapshot` writes it, atomically
    (its folder made if missing, a temporary file in it, renamed over `path`); a failure is one
    ValueError line."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        _write(folder, path, snapshot)
    except OSError as error:
        raise ValueError(f"snapshot: {path}: cannot write ({error.strerror or error})") from None


def _write(folder: str, path: str, snapshot: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".trainmem-", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as open() would make it (mkstemp's is 0600)
        with os.fdopen(fd, "wb") as out:
            pickle.dump(snapshot, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
