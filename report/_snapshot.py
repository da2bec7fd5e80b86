"""A PyTorch CUDA memory snapshot read safely and replayed: what `torch.cuda.memory._snapshot()`
returns and `torch.cuda.memory._dump_snapshot(path)` pickles (an OOM-time dump alike), its
allocations attributed to trainmem's components from their stack frames and lifetimes.

Reading: a pickle is code; this one is unpickled by `_DataUnpickler`, which refuses every global
(so only the pickle machine's own containers and scalars come out: dict, list, tuple, str,
int, float, bool, None, bytes), from at most MAX_SNAPSHOT_BYTES read by the bounded file
reader (hardware/_files.py), and checked field by field (`check_snapshot`): a bad file is one
ValueError line naming the field.

Format. Source: torch/cuda/memory.py (_snapshot's Snapshot, Segment, Block, TraceEntry, Frame
TypedDicts) and torch/csrc/cuda/memory_snapshot.cpp (the keys written: segments with device,
address, total_size, allocated_size, active_size, requested_size, stream, segment_type,
segment_pool_id, is_expandable, frames, blocks; blocks with address, size, requested_size,
state active_allocated | active_pending_free | inactive, frames; device_traces entries with
action alloc | free_requested | free_completed | segment_alloc | segment_free | segment_map |
segment_unmap | snapshot | oom, addr (device_free for an oom), size, stream, frames, time_us;
allocator_settings), torch 2.5 to 2.13. `torch.cuda.memory_snapshot()`'s bare list of segments
is read too (no trace).

Replay (`replay`): the trace's allocations in order, from the blocks alive before its first
entry (a free of an address the trace never allocated, or a block active at the end that it
never allocated: a truncated ring buffer, or history recorded after the model was built). The
allocated bytes of an allocation are its size rounded up to 512 (CUDACachingAllocator.cpp
round_size); reserved moves with segment_alloc/free/map/unmap and ends at the segments' total.
Ignores: the unsplit remainder of a large block (at most 1 MiB, counted by torch's allocated
statistics, not by the trace's sizes) and streams.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainmem.hardware._files import read_input_bytes, shown_path

MAX_SNAPSHOT_BYTES = 512 << 20
"""The largest snapshot file read (512 MiB): a history of 100,000 entries with Python and C++
stacks pickles to tens of MiB; unpickled, a snapshot takes up to about 15 times its file (600
MiB for a 39 MiB file of 600,000 entries, read and explained in 17 s on one core)."""
BLOCK_BYTES = 512
"""CUDACachingAllocator.cpp kMinBlockSize: an allocation's bytes are rounded up to it."""
ACTIONS = (
    *("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free"),
    *("segment_map", "segment_unmap", "snapshot", "oom", "free"),
)
"""TraceEntry actions (memory_snapshot.cpp action_to_str; `free` from torch < 2.1)."""
BLOCK_STATES = ("active_allocated", "active_pending_free", "active_awaiting_free", "inactive")
"""Block states (memory_snapshot.cpp writes active_pending_free; memory.py's docstring says
active_awaiting_free)."""


class _DataUnpickler(pickle.Unpickler):
    """An unpickler that builds data only: every global (class, function) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refuses the global {module}.{name} (data only)")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refuses a persistent id (data only)")


def load_snapshot(path: str, *, cap_bytes: int = MAX_SNAPSHOT_BYTES) -> dict[str, Any]:
    """The snapshot pickled at `path`, read to at most `cap_bytes` and unpickled as data only,
    checked (`check_snapshot`); ValueError (one line naming the file) otherwise."""
    data = read_input_bytes(path, what="snapshot", cap_bytes=cap_bytes)
    head = f"snapshot: {shown_path(path)}"
    try:
        value = _DataUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise ValueError(f"{head}: not a torch memory snapshot pickle ({exc})") from None
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
        raise ValueError(f"{head}: not a pickle ({type(exc).__name__}: {exc})") from None
    except (MemoryError, RecursionError):
        raise ValueError(f"{head}: too deeply nested or too large to unpickle") from None
    try:
        return check_snapshot(value)
    except ValueError as exc:
        raise ValueError(f"{head}: {exc}") from None


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where} must be an integer, got {type(value).__name__}")
    return value


def _frames(value: Any, where: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{where}.frames must be a list, got {type(value).__name__}")
    for k, f in enumerate(value):
        if not isinstance(f, dict) or not isinstance(f.get("name", ""), str):
            raise ValueError(f"{where}.frames[{k}] must be a dict with filename, line, name")
        if not isinstance(f.get("filename", ""), str):
            raise ValueError(f"{where}.frames[{k}].filename must be a string")
    return value


def check_snapshot(value: Any) -> dict[str, Any]:
    """`value` as a snapshot dict ({"segments", "device_traces", ...}), every field the replay
    reads checked (ValueError naming the first bad one); a bare list of segments
    (torch.cuda.memory_snapshot()) becomes {"segments": it, "device_traces": []}."""
    if isinstance(value, list):
        value = {"segments": value, "device_traces": []}
    if not isinstance(value, dict) or "segments" not in value:
        got = type(value).__name__
        raise ValueError(
            f"expected a dict with 'segments' (torch.cuda.memory._snapshot()), got {got}"
        )
    segments = value["segments"]
    if not isinstance(segments, list):
        raise ValueError("segments must be a list")
    for i, s in enumerate(segments):
        where = f"segments[{i}]"
        if not isinstance(s, dict):
            raise ValueError(f"{where} must be a dict")
        for key in ("address", "total_size"):
            _int(s.get(key), f"{where}.{key}")
        _int(s.get("device", 0), f"{where}.device")
        blocks = s.get("blocks", [])
        if not isinstance(blocks, list):
            raise ValueError(f"{where}.blocks must be a list")
        for j, b in enumerate(blocks):
            bw = f"{where}.blocks[{j}]"
            if not isinstance(b, dict):
                raise ValueError(f"{bw} must be a dict")
            _int(b.get("size"), f"{bw}.size")
            _int(b.get("address", 0), f"{bw}.address")
            if b.get("state") not in BLOCK_STATES:
                raise ValueError(f"{bw}.state must be one of {', '.join(BLOCK_STATES)}")
            _frames(b.get("frames"), bw)
    traces = value.get("device_traces", [])
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise ValueError("device_traces must be a list of lists (one per device)")
    for d, trace in enumerate(traces):
        for i, e in enumerate(trace):
            where = f"device_traces[{d}][{i}]"
            if not isinstance(e, dict) or e.get("action") not in ACTIONS:
                raise ValueError(f"{where}.action must be one of {', '.join(ACTIONS)}")
            _int(e.get("size", 0), f"{where}.size")
            _int(e.get("addr", e.get("device_free", 0)), f"{where}.addr")
            _frames(e.get("frames"), where)
    return value


def rounded(size: int) -> int:
    """CUDACachingAllocator.cpp round_size: the block bytes of a request (512 at least)."""
    return max(-(-size // BLOCK_BYTES) * BLOCK_BYTES, BLOCK_BYTES)


@dataclass(frozen=True, slots=True)
class Allocation:
    """One allocation's life in the replay: positions are entries of the trace (0: before the
    first; entry i at i + 1); `end` is past the last entry when it is alive at the end."""

    start: int
    end: int
    size_bytes: int
    frames: tuple[tuple[str, str], ...]
    """(filename, name) of each frame, innermost first."""
    preexisting: bool


@dataclass(slots=True, kw_only=True)
class Replay:
    """A device's trace replayed: its allocations and the reserved bytes after each entry."""

    device: int
    num_positions: int
    allocations: list[Allocation]
    reserved_bytes: np.ndarray
    """Reserved bytes at each position (num_positions)."""
    oom: dict[str, int] | None = None
    """The first oom entry: requested_bytes, device_free_bytes, position."""
    num_entries: int = 0
    warnings: list[str] = field(default_factory=list)
    allocator_settings: dict[str, Any] = field(default_factory=dict)
    """The snapshot's allocator_settings (torch >= 2.5; {} when absent)."""


def _frame_keys(frames: Any) -> tuple[tuple[str, str], ...]:
    return tuple((str(f.get("filename", "")), str(f.get("name", ""))) for f in frames or ())


def _version_bump(trace: list[dict[str, Any]], i: int, last: Allocation) -> bool:
    """Whether alloc entry `i` re-creates the allocation freed just before it (torch.profiler's
    INCREMENT_VERSION, which torch.cuda._memory_viz._profile_to_snapshot writes as a free and
    an alloc of the same address and size; its entries carry a `category`)."""
    if i < 1 or trace[i - 1]["action"] != "free_completed":
        return False
    before, e = trace[i - 1], trace[i]
    same = before.get("addr") == e.get("addr") and before.get("size") == e.get("size")
    return same and last.end == i and rounded(int(e.get("size", 0))) == last.size_bytes


def _device_of(snapshot: Mapping[str, Any]) -> int:
    """The device replayed: the one with the longest trace, else the first segment's."""
    traces = snapshot.get("device_traces", [])
    if traces and max(len(t) for t in traces) > 0:
        return max(range(len(traces)), key=lambda d: len(traces[d]))
    segments = snapshot["segments"]
    return int(segments[0].get("device", 0)) if segments else 0


def replay(snapshot: Mapping[str, Any]) -> Replay:
    """The trace of the snapshot's device replayed from the blocks alive before it (module
    docstring): each allocation's life, and reserved bytes at every position."""
    device = _device_of(snapshot)
    traces = snapshot.get("device_traces", [])
    trace = traces[device] if device < len(traces) else []
    segments = [s for s in snapshot["segments"] if int(s.get("device", 0)) == device]
    n = len(trace) + 1
    live: dict[int, tuple[int, int, tuple]] = {}  # addr -> (start, size, frames)
    done: list[Allocation] = []
    reserved_delta = np.zeros(n, dtype=np.int64)
    oom = None
    for i, e in enumerate(trace):
        action, pos = e["action"], i + 1
        addr = int(e.get("addr", 0))
        if action == "alloc":
            if "category" in e and done and _version_bump(trace, i, done[-1]):
                resumed = done.pop()  # the profiler's in-place update: the same tensor goes on
                live[addr] = (resumed.start, resumed.size_bytes, resumed.frames)
                continue
            live[addr] = (pos, rounded(int(e.get("size", 0))), _frame_keys(e.get("frames")))
        elif action in ("free_completed", "free"):
            start, size, frames = live.pop(addr, (0, rounded(int(e.get("size", 0))), None))
            if frames is None:  # allocated before the trace: the free's frames are its alloc's
                frames = _frame_keys(e.get("frames"))
            done.append(Allocation(start, pos, size, frames, start == 0))
        elif action in ("segment_alloc", "segment_map"):
            reserved_delta[pos] += int(e.get("size", 0))
        elif action in ("segment_free", "segment_unmap"):
            reserved_delta[pos] -= int(e.get("size", 0))
        elif action == "oom" and oom is None:
            oom = {
                "requested_bytes": int(e.get("size", 0)),
                "device_free_bytes": int(e.get("device_free", 0)),
                "position": pos,
            }
    warnings: list[str] = []
    traced = set(live)
    for s in segments:
        address = int(s["address"])
        for b in s.get("blocks", []):
            size = int(b["size"])
            at, address = int(b.get("address", address)), address + size  # as the C++ counts
            if b["state"] != "inactive" and at not in traced:
                done.append(Allocation(0, n, size, _frame_keys(b.get("frames")), True))
    for start, size, frames in live.values():
        done.append(Allocation(start, n, size, frames, False))
    reserved_end = sum(int(s["total_size"]) for s in segments)
    reserved = reserved_end - int(reserved_delta.sum()) + np.cumsum(reserved_delta)
    if not trace:
        warnings.append(
            "the snapshot has no allocation history (record it with "
            "torch.cuda.memory._record_memory_history() before the step): its live blocks only"
        )
    done.sort(key=lambda a: (a.start, a.end))
    return Replay(
        device=device,
        num_positions=n,
        allocations=done,
        reserved_bytes=reserved.astype(np.int64),
        oom=oom,
        num_entries=len(trace),
        warnings=warnings,
        allocator_settings=_settings(snapshot.get("allocator_settings")),
    )


def _settings(value: Any) -> dict[str, Any]:
    """allocator_settings as a dict of its scalar entries ({} when absent or not a dict)."""
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(v, (bool, int, float, str))}
