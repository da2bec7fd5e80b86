"""A replayed snapshot (report/_snapshot.py) attributed to trainmem's components (the names
`estimate --json` uses under `bytes`), from each allocation's stack frames and lifetime.

Each allocation's frames say what made it (`frame_kind`, first rule that matches, innermost
frame first within a rule):
- a trainmem predicted snapshot (`estimate --memory-viz`): its frame names the component;
- NCCL / c10d communicator buffers (ProcessGroupNCCL, ncclMemAlloc, c10d) outside FSDP's
  all-gathers, and the cuBLAS workspaces (CublasHandlePool): framework_overhead;
- torch.optim and the other optimizers' packages: the optimizer;
- the autograd engine (torch/autograd, torch::autograd::Engine, checkpoint's recompute hooks):
  backward;
- module construction or loading (nn.Module __init__, reset_parameters, load_state_dict, _apply,
  from_pretrained): setup;
- a module's forward (torch/nn/modules/module.py _call_impl): forward;
- anything else: the phase of the allocations around it.

The phase runs in order (setup, forward, backward, optimizer, forward, ...) and an allocation is
its phase's persistent component when it is still alive where that phase hands over, else
transient (an allocation no frame explains, made outside forward, is a parameter only when it
lives to the end of a trace that passes an optimizer step, else an input of the forward it
lives into): setup -> parameters when alive at the first forward (the warm-up gradients a loop
frees before it are not); forward -> activations when alive when backward starts; backward ->
gradients when alive when the optimizer starts (where the optimizer allocates nothing, as
SGD, when alive after its backward returns, where backward's root gradient is freed, else
after its last allocation: zero_grad frees them later); optimizer -> optimizer states when alive at
the next forward. A trace that ends inside a phase (an OOM dump) counts what is alive at its
end, and in backward only blocks of a parameter's size as gradients. Blocks alive before the
trace that no frame explains count as parameters (history recorded after the optimizer's first
step shows its states so: record it from the start).

Source: the frames torch's recorder writes (torch/csrc/profiler/combined_traceback.cpp: Python
frames innermost first, C++ frames named by their symbols under `_record_memory_history(stacks=
"all")`, the default); torch/optim/optimizer.py (lazy state at the first step), torch/utils/
checkpoint.py (recompute inside backward's unpack hooks).
Ignores: master weights (counted with the optimizer states or parameters that hold them),
streams, CUDA graphs' private pools; the CUDA context and NCCL's own buffers are outside the
allocator and never in a snapshot.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import numpy as np

from trainmem.engine import COMPONENTS

from ._snapshot import Allocation, Replay

PERSISTENT_OF_PHASE = {
    "setup": "parameters",
    "forward": "activations",
    "backward": "gradients",
    "optimizer": "optimizer_states",
}
"""The component an allocation of a phase is when it outlives the phase."""
HANDOVER = {"setup": "forward", "forward": None, "backward": None, "optimizer": "forward"}
"""Where a phase's allocation must still be alive to persist: the next position of this phase
(None: the next position of any other phase)."""

_NCCL = re.compile(r"nccl|ProcessGroupNCCL|c10d::|/c10d/", re.IGNORECASE)
_FSDP = re.compile(r"fsdp|fully_shard|_composable", re.IGNORECASE)
_WORKSPACE = re.compile(
    r"CublasHandlePool|getCurrentCUDABlasHandle|cublasLt|getCUDABlasLtWorkspace"
)
_OPTIMIZER = re.compile(
    r"torch/optim/|bitsandbytes/optim|deepspeed/ops/(adam|lamb|lion)|apex/optimizers|/optimizers?/"
)
_BACKWARD_FILES = re.compile(r"torch/autograd/(__init__|graph|function)\.py")
_BACKWARD_NAMES = re.compile(r"torch::autograd::Engine|autograd::Node|evaluate_function")
_RECOMPUTE = ("unpack_hook", "recompute_fn", "_checkpoint_hook")
_SETUP_NAMES = frozenset(
    ("reset_parameters", "load_state_dict", "_load_from_state_dict", "_apply", "from_pretrained")
)
_MODULE_FILE = "torch/nn/modules/module.py"


_PROFILER_FRAME = re.compile(r"(?P<path>.+)\((?P<line>\d+)\): (?P<name>.+)")
"""A frame torch.cuda._memory_viz._profile_to_snapshot writes: filename "none", the name
"path(line): function" (torch.profiler's Python call events)."""


def _frame_parts(filename: str, name: str) -> tuple[str, str]:
    """(path, function) of a frame, from either spelling (recorder's, or the profiler's)."""
    found = _PROFILER_FRAME.fullmatch(name)
    if found and filename in ("", "none", "??"):
        return found["path"], found["name"]
    return filename, name


@functools.lru_cache(maxsize=1 << 16)  # a step repeats a few thousand distinct stacks
def frame_kind(frames: tuple[tuple[str, str], ...]) -> str:
    """What made an allocation, from its (filename, name) frames: a component name (trainmem's
    own snapshot), "overhead", "optimizer", "backward", "setup", "forward" or "unknown"."""
    for filename, name in frames:
        if filename.startswith("trainmem:") and name in COMPONENTS:
            return name
    parts = [_frame_parts(f, n) for f, n in frames]
    text = "\n".join(f"{f} {n}" for f, n in parts)
    if _WORKSPACE.search(text) or (_NCCL.search(text) and not _FSDP.search(text)):
        return "overhead"
    if _OPTIMIZER.search(text):
        return "optimizer"
    for filename, name in parts:
        if _BACKWARD_FILES.search(filename) or _BACKWARD_NAMES.search(name):
            return "backward"
        if filename.endswith("torch/utils/checkpoint.py") and name in _RECOMPUTE:
            return "backward"
    for filename, name in parts:
        if name in _SETUP_NAMES or (name == "__init__" and "torch/nn/modules/" in filename):
            return "setup"
    if any(f.endswith(_MODULE_FILE) for f, _ in parts):
        return "forward"
    return "unknown"


def _phases(allocs: list[Allocation], kinds: list[str]) -> list[str]:
    """Each allocation's phase: its kind where the kind is a phase, else the phase before."""
    phase, out = "setup", []
    for a, kind in zip(allocs, kinds, strict=True):
        if not a.preexisting:
            if kind in PERSISTENT_OF_PHASE:
                phase = kind
            out.append(phase)
        else:
            out.append("preexisting")
    return out


def _phase_starts(allocs: list[Allocation], phases: list[str]) -> dict[str, np.ndarray]:
    """The positions where each phase's runs begin, where any run begins ("any"), and where
    each backward run ends ("backward_last"): where its root gradient (torch/autograd's
    _make_grads, freed when backward returns) is freed, else its last allocation."""
    starts: dict[str, list[int]] = {p: [] for p in (*PERSISTENT_OF_PHASE, "any")}
    last: list[int] = []
    roots: list[bool] = []
    previous = None
    for a, phase in zip(allocs, phases, strict=True):
        if phase == "preexisting":
            continue
        if phase == "backward":
            if previous != "backward":  # the run's root gradient ends it where it is one
                root = any(name == "_make_grads" for _, name in a.frames)
                last.append(a.end if root else a.start)
                roots.append(root)
            if not roots[-1]:
                last[-1] = a.start
        if phase == previous:
            continue
        starts[phase].append(a.start)
        starts["any"].append(a.start)
        previous = phase
    return {
        **{k: np.asarray(v, dtype=np.int64) for k, v in starts.items()},
        "backward_last": np.asarray(last, dtype=np.int64),
    }


def _after(starts: np.ndarray, position: int) -> int | None:
    """The first of `starts` after `position` (None when there is none)."""
    k = int(np.searchsorted(starts, position, side="right"))
    return int(starts[k]) if k < len(starts) else None


def _optimizer_follows(starts: dict[str, np.ndarray], position: int) -> bool:
    """Whether the run after `position` is an optimizer run (it allocates: AdamW's states and
    temporaries; SGD's in-place update makes none)."""
    following = _after(starts["any"], position)
    optimizer = starts["optimizer"]
    k = int(np.searchsorted(optimizer, following)) if following is not None else len(optimizer)
    return k < len(optimizer) and int(optimizer[k]) == following


def _component(
    a: Allocation, kind: str, phase: str, starts: dict[str, np.ndarray], num_positions: int
) -> str:
    """The component of one allocation (module docstring's rules)."""
    if kind in COMPONENTS:
        return kind
    if kind == "overhead":
        return "framework_overhead"
    if phase == "preexisting":
        return {"optimizer": "optimizer_states", "backward": "gradients"}.get(kind, "parameters")
    if kind == "unknown" and phase != "forward":
        # Made by the loop's own code (a batch moved to the device, say): a parameter only
        # when it outlives a whole step (to the end, past an optimizer step); else an input
        # of the forward that follows, if it lives into one.
        stepped = _after(starts["optimizer"], a.start) is not None
        if phase == "setup" and a.end >= num_positions and stepped:
            return "parameters"
        forward = _after(starts["forward"], a.start)
        if forward is None or a.end <= forward:
            return "transient"
        a, phase = Allocation(forward, a.end, a.size_bytes, a.frames, False), "forward"
    if phase == "backward" and not _optimizer_follows(starts, a.start):
        # no optimizer allocation follows (SGD updates in place): a gradient outlives its
        # backward (_phase_starts' backward_last)
        run = int(np.searchsorted(starts["backward"], a.start, side="right")) - 1
        return "gradients" if a.end > int(starts["backward_last"][run]) else "transient"
    target = HANDOVER[phase]
    handover = _after(starts[target] if target else starts["any"], a.start)
    if handover is None:  # the trace ends in this phase (or before the first forward)
        alive_at_end = a.end >= num_positions
        return PERSISTENT_OF_PHASE[phase] if alive_at_end else "transient"
    return PERSISTENT_OF_PHASE[phase] if a.end > handover else "transient"


def attribute(replayed: Replay) -> dict[str, Any]:
    """The replay attributed: `measured` (component -> bytes: the persistent ones at their
    largest, transient and fragmentation at the allocated peak, as `estimate --json`'s
    `bytes`), `measured_at_peak` (component -> bytes at the allocated peak, as
    `breakdown_at_peak`), the peaks and the counts."""
    allocs = replayed.allocations
    kinds = [frame_kind(a.frames) for a in allocs]
    phases = _phases(allocs, kinds)
    starts = _phase_starts(allocs, phases)
    n = replayed.num_positions
    names = [_component(a, k, p, starts, n) for a, k, p in zip(allocs, kinds, phases, strict=True)]
    names = _parameter_sized(allocs, names, phases, starts)
    index = {c: k for k, c in enumerate(COMPONENTS)}
    delta = np.zeros((len(COMPONENTS), n + 1), dtype=np.int64)
    rows = np.array([index[c] for c in names], dtype=np.int64)
    if allocs:
        size = np.array([a.size_bytes for a in allocs], dtype=np.int64)
        np.add.at(delta, (rows, np.array([a.start for a in allocs])), size)
        np.add.at(delta, (rows, np.array([a.end for a in allocs])), -size)
    live = np.cumsum(delta, axis=1)[:, :n]  # component x position
    allocated = live.sum(axis=0)
    at = n - 1 - int(np.argmax(allocated[::-1]))  # the last peak: a later step's, when tied
    peak_allocated = int(allocated[at])
    peak_reserved = int(max(replayed.reserved_bytes.max(), peak_allocated))
    largest = {c: int(live[index[c]].max()) for c in COMPONENTS}
    at_peak = {c: int(live[index[c], at]) for c in COMPONENTS}
    fragmentation = peak_reserved - peak_allocated
    at_peak["fragmentation"] = fragmentation
    measured = {**largest, "transient": at_peak["transient"], "fragmentation": fragmentation}
    return {
        "measured": measured,
        "measured_at_peak": at_peak,
        "peak_allocated_bytes": peak_allocated,
        "peak_reserved_bytes": peak_reserved,
        "allocated_at_end_bytes": int(allocated[-1]),
        "reserved_at_end_bytes": int(replayed.reserved_bytes[-1]),
        "peak_position": at,
        "num_allocations": len(allocs),
        "num_trace_entries": replayed.num_entries,
        "device": replayed.device,
        "phases_seen": sorted({p for p in phases if p != "preexisting"}),
    }


def _parameter_sized(
    allocs: list[Allocation], names: list[str], phases: list[str], starts: dict[str, np.ndarray]
) -> list[str]:
    """Where no optimizer allocation follows a backward (SGD; an OOM dump that ends inside
    backward), its gradients are only the blocks of a parameter's size (the others are its
    working set)."""
    param_sizes = {a.size_bytes for a, c in zip(allocs, names, strict=True) if c == "parameters"}
    out = list(names)
    for k, (a, c) in enumerate(zip(allocs, names, strict=True)):
        if c != "gradients" or phases[k] != "backward" or a.size_bytes in param_sizes:
            continue
        if not _optimizer_follows(starts, a.start):
            out[k] = "transient"
    return out
