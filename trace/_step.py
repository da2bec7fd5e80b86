"""One measured training step with every device storage tracked (imports torch: load lazily).

The step is the Hugging Face Trainer's: forward (under autocast for amp-bf16) to the loss,
backward, optimizer.step(), zero_grad(set_to_none=True). A warm-up first, so that the measured
step starts with the optimizer states present: an optimizer step on zero gradients (the same
state at half the cost of a whole step; checked against the ground truth to the byte), or a
whole step where the model initialises itself in its first forward (FSDP2). A
TorchDispatchMode sees every op's outputs; each new storage on the traced device is counted,
rounded up to 512 bytes as the CUDA caching allocator counts memory_allocated, and uncounted when
Python frees it (or FSDP2 resizes it). The live total's maximum per phase is
that phase's peak; what the forward pass leaves alive is the activations.

Each storage also records where it was made: inside which of the repeated blocks (the largest
nn.ModuleList of one module class, e.g. the decoder layers, with any other list of that class:
an encoder's and a decoder's blocks), or outside them, and whether it is an
autocast copy of a weight (a dtype cast of a parameter, which autocast caches until backward).

Source: torch/distributed/_tools/mem_tracker.py (the same storage accounting: weak references to
untyped storages, 512-byte rounding; DTensor ops left to DTensor so that its local ops are seen,
wait_tensor in place under fake tensors, DTensor's sharding-propagation fake mode skipped; the
ground truth used it), c10/cuda/CUDACachingAllocator.cpp (kMinBlockSize = 512).
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch._guards import active_fake_mode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from ._allocator import simulate_reserved

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - a torch built without torch.distributed
    DTensor = None  # type: ignore[misc,assignment]

BLOCK_BYTES = 512
"""c10/cuda/CUDACachingAllocator.cpp kMinBlockSize: memory_allocated counts rounded blocks."""
OUTSIDE = -1
"""Owner of a storage made outside the repeated blocks."""


def local_tensor(t: Any) -> Any:
    """A DTensor's shard on this rank (FSDP2, tensor parallelism); any other tensor itself."""
    return getattr(t, "_local_tensor", t)


def rounded(num_bytes: int) -> int:
    """Bytes the caching allocator counts for a storage of `num_bytes`."""
    return -(-num_bytes // BLOCK_BYTES) * BLOCK_BYTES


@dataclass(kw_only=True)
class StepJob:
    """What a step trains: the module, its example batch and how the loss comes from them."""

    model: Any
    batch: Any
    loss: Callable[[Any, Any], Any]
    """loss(model, batch) -> a scalar tensor."""
    enable_recompute: Callable[[Any], None] | None = None
    """Turns on per-block activation checkpointing (None: checkpoint the repeated blocks)."""
    full_warm_up: bool = False
    """Warm up with a whole step (FSDP2 initialises itself in its first forward); else only an
    optimizer step on zero gradients, which leaves the same state behind at half the cost."""
    dtypes_set: bool = False
    """The builder set every tensor's dtype (LoRA: fp32 adapters on a bf16 base, trace/_lora.py);
    else run_step casts the model to bf16 for precision bf16."""


class Tracker(TorchDispatchMode):
    """Live bytes of `device_type` storages, per phase peaks, and each storage's origin."""

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.fake_mode_on_entry: Any = None
        self.plain_resize: Any = None
        self.device_type = device_type
        self.live: Any = WeakIdKeyDictionary()  # storage -> ([bytes], sequence number, owner)
        self.current_bytes = 0
        self.peaks: dict[str, int] = {}
        self.peak_sequence: dict[str, int] = {}
        self.phase = "setup"
        self.scope = OUTSIDE
        self.sequence = 0
        self.parameter_storages: Any = WeakIdKeyDictionary()
        self.events: list[tuple[Any, ...]] | None = None
        """When a list: the allocation log, in order (trace/_allocator.py's events): ("alloc",
        sequence number, bytes, phase), ("resize", sequence number, new bytes, phase),
        ("free", sequence number). None (the default): nothing logged."""
        self.frames: Any = None
        """When a trace/_snapshot.py FrameRecorder: each logged storage's stack frames (for
        the memory snapshot run_step writes). None (the default): none recorded."""

    def _forget(self, cell: list[int]) -> None:
        self.current_bytes -= cell[0]

    def _forget_logged(self, cell: list[int], sequence: int) -> None:
        self.current_bytes -= cell[0]
        if self.events is not None:
            self.events.append(("free", sequence))

    def _note_peak(self) -> None:
        if self.current_bytes > self.peaks.get(self.phase, -1):
            self.peaks[self.phase] = self.current_bytes
            self.peak_sequence[self.phase] = self.sequence

    def __enter__(self) -> Any:
        self.fake_mode_on_entry = active_fake_mode()
        # FSDP2 frees and refills its unsharded parameters with UntypedStorage.resize_, which the
        # dispatcher does not see (mem_tracker.py patches it the same way).
        self.plain_resize = plain = torch.UntypedStorage.resize_
        tracker = self

        def resize_(storage: Any, size: int) -> Any:
            out = plain(storage, size)
            entry = tracker.live.get(storage)
            if entry is not None:
                cell = entry[0]
                new = rounded(storage.nbytes())
                if tracker.events is not None:
                    tracker.events.append(("resize", entry[1], new, tracker.phase))
                tracker.current_bytes += new - cell[0]
                cell[0] = new
                tracker._note_peak()
            return out

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign,assignment]
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        torch.UntypedStorage.resize_ = self.plain_resize  # type: ignore[method-assign]
        return super().__exit__(*exc)

    def add(self, t: Any, owner: Any) -> None:
        """Count `t`'s storage if it is new and on the traced device."""
        if not isinstance(t, torch.Tensor) or t.device.type != self.device_type:
            return
        t = local_tensor(t)
        storage = t.untyped_storage()
        if storage in self.live:
            return
        cell = [rounded(storage.nbytes())]  # zero-size ones too: FSDP2 resizes them later
        self.sequence += 1
        self.live[storage] = (cell, self.sequence, owner)
        self.current_bytes += cell[0]
        if self.events is None:
            weakref.finalize(storage, self._forget, cell)
        else:
            self.events.append(("alloc", self.sequence, cell[0], self.phase))
            if self.frames is not None:
                self.frames.record(self.sequence)
            weakref.finalize(storage, self._forget_logged, cell, self.sequence)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if DTensor is not None and any(t is DTensor for t in types):
            return NotImplemented  # let DTensor run its local ops, which come back here
        if func is torch.ops._c10d_functional.wait_tensor.default and self.fake_mode_on_entry:
            out = args[0]  # eager waits in place; the fake kernel would return a new tensor
        else:
            out = func(*args, **(kwargs or {}))
        if active_fake_mode() is not self.fake_mode_on_entry:
            return out  # DTensor's sharding propagation on its own fake tensors: no memory
        owner: Any = self.scope
        if (
            func is torch.ops.aten._to_copy.default
            and args
            and isinstance(args[0], torch.Tensor)
            and local_tensor(args[0]).untyped_storage() in self.parameter_storages
        ):
            owner = ("weight_copy", self.scope)  # autocast's cached cast of a weight
        for t in tree_flatten(out)[0]:
            self.add(t, owner)
        self._note_peak()
        return out

    def storages_bytes(self, tensors: Any, *, after: int = 0, until: int | None = None) -> int:
        """Rounded bytes of the distinct tracked storages behind `tensors`, made after sequence
        number `after` and up to `until`."""
        seen: set[int] = set()
        total = 0
        for t in tensors:
            if t is None or t.device.type != self.device_type:
                continue
            storage = local_tensor(t).untyped_storage()
            entry = self.live.get(storage)
            if entry is None or id(storage) in seen:
                continue
            cell, seq, _ = entry
            if seq > after and (until is None or seq <= until):
                seen.add(id(storage))
                total += cell[0]
        return total

    def made_after(self, after: int) -> dict[Any, int]:
        """Live bytes made after sequence number `after`, by owner."""
        out: dict[Any, int] = {}
        for cell, seq, owner in list(self.live.values()):
            if seq > after:
                out[owner] = out.get(owner, 0) + cell[0]
        return out


def cast_floating(model: Any, dtype: Any) -> None:
    """model.to(dtype) for floating parameters and buffers, in place (`.data`), which also works
    on fake tensors (Module.to swaps tensor subclasses and refuses weakly referenced ones)."""
    for t in [*model.parameters(), *model.buffers()]:
        if t.is_floating_point() and t.dtype != dtype:
            t.data = t.data.to(dtype)


def find_blocks(model: Any) -> tuple[str, list[Any]]:
    """The repeated blocks: the nn.ModuleList with the most children of a single class, then
    every other ModuleList of children of that class outside it (an encoder-decoder's decoder
    blocks after its encoder's, T5's encoder.block and decoder.block); their paths joined by ","."""
    lists = [
        (name, list(module))
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.ModuleList)
        and len(module)
        and len({type(c) for c in module}) == 1
    ]
    if not lists:
        return "", []
    first, blocks = max(lists, key=lambda item: len(item[1]))  # the first of the largest
    cls = type(blocks[0])
    paths = [first]
    for name, children in lists:
        inside = any(name.startswith(f"{p}.") or p.startswith(f"{name}.") for p in paths)
        if name != first and type(children[0]) is cls and not inside:
            paths.append(name)
            blocks = [*blocks, *children]
    return ",".join(paths), blocks


def checkpoint_blocks(blocks: list[Any]) -> None:
    """Per-block activation checkpointing (non-reentrant), as transformers does per layer.

    Source: transformers/modeling_layers.py GradientCheckpointingLayer (checkpoints `forward`, so
    module hooks stay outside), torch/utils/checkpoint.py (use_reentrant=False)."""
    from functools import partial

    from torch.utils.checkpoint import checkpoint

    for block in blocks:
        block.forward = partial(checkpoint, block.forward, use_reentrant=False)


def _param_groups(params: list[Any]) -> list[Any]:
    """The parameters as one list, or one group per device mesh (plain tensors apart) where
    DTensors of a mesh sit next to other tensors (tensor parallelism keeps norms plain): one
    foreach or fused call cannot mix them.

    Source: transformers/trainer.py create_optimizer (has_mixed_dtensor: a param group per
    mesh), transformers 5.24."""
    meshes: dict[Any, list[Any]] = {}
    for p in params:
        mesh = p.device_mesh if DTensor is not None and isinstance(p, DTensor) else None
        meshes.setdefault(mesh, []).append(p)
    if len(meshes) < 2:
        return params
    return [{"params": group} for group in meshes.values()]


def _make_optimizer(params: list[Any], optimizer: str) -> Any:
    """AdamW foreach (the CUDA default), fused or one tensor at a time (adamw-loop:
    foreach=False); SGD with or without momentum 0.9."""
    groups = _param_groups(params)
    if optimizer.startswith("adamw"):
        fused = optimizer == "adamw-fused"
        foreach = optimizer == "adamw"
        return torch.optim.AdamW(groups, foreach=foreach, fused=fused)
    momentum = 0.9 if optimizer == "sgd-momentum" else 0.0
    return torch.optim.SGD(groups, lr=0.01, momentum=momentum, foreach=True)


@dataclass(kw_only=True)
class _Prepared:
    """A job set up for its steps inside the step's contexts: the model cast and checkpointed,
    its repeated blocks hooked, its parameters registered with the tracker, its optimizer made."""

    job: StepJob
    block_path: str
    blocks: list[Any]
    widths: list[int]
    """A block's input width per token, once the first block has run (the hidden size)."""
    params: list[Any]
    trainable: list[Any]
    opt: Any


def run_step(
    build: Callable[[], StepJob],
    *,
    precision: str,
    recompute: str,
    optimizer: str,
    device_type: str,
    contexts: list[Any],
    on_phase_end: Callable[[str], None] | None = None,
    full_warm_up: bool = False,
    snapshot: str | None = None,
) -> dict[str, Any]:
    """Build the job inside `contexts` (fake mode, fake device, ...), run a warm-up and a measured
    step, and return the measurement (see trace_step in _trace.py for the keys).

    snapshot: also write what was traced (build, warm-up, measured step) here as a PyTorch
    memory snapshot pickle, each allocation with its stack frames (trace/_snapshot.py).

    full_warm_up: warm up with a whole step (as job.full_warm_up; on a real device the caching
    allocator's state after a whole step is what a training loop's second step meets).

    on_phase_end(name) is called before the measured step ("warm-up") and after each of its
    phases ("forward", "backward", "optimizer_step"): --real-gpu reads the CUDA allocator's
    statistics there.

    Also peak_reserved_simulated_bytes: the tracker's allocation log (setup, warm-up and the
    measured step) replayed through trace/_allocator.py's caching allocator, the peak counted from
    the measured step's start as torch.cuda.max_memory_reserved after reset_peak_memory_stats;
    without the cuBLAS workspaces (64 MiB on sm90), as the traced peaks. The allocator's cache
    depends on the history: it matches a training loop's second step only where the build and
    the warm-up are the loop's own (a whole-step warm-up, the model built as the job builds it)."""
    started = time.perf_counter()
    tracker = Tracker(device_type)
    tracker.events = []  # the allocation log, replayed through the caching allocator at the end
    if snapshot is not None:
        from ._snapshot import FrameRecorder

        tracker.frames = FrameRecorder()
    with contextlib.ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context)
        stack.enter_context(tracker)
        run = _prepare(
            build,
            tracker,
            device_type=device_type,
            precision=precision,
            recompute=recompute,
            optimizer=optimizer,
        )
        marks: dict[str, Any] = {}
        amp = precision == "amp-bf16"

        def step() -> None:
            _train_step(run, tracker, marks, amp=amp, on_phase_end=on_phase_end)

        # warm-up: the optimizer states exist from here on
        if run.job.full_warm_up or full_warm_up:
            step()
        else:
            _optimizer_warm_up(run)
        tracker.peaks.clear()
        tracker.peak_sequence.clear()
        marks["measured"] = True
        marks["measured_event"] = len(tracker.events)
        step()
        out = _measurement(tracker, marks, run, started=started)
    if snapshot is not None:
        from ._snapshot import snapshot_of, write_snapshot

        write_snapshot(snapshot, snapshot_of(tracker.events, tracker.frames.frames))
    return out


def _prepare(
    build: Callable[[], StepJob],
    tracker: Tracker,
    *,
    device_type: str,
    precision: str,
    recompute: str,
    optimizer: str,
) -> _Prepared:
    """Build the job on `device_type` (inside the step's contexts and `tracker`, so that its
    storages count from the start), cast it to bf16 for `bf16` unless the builder set the
    dtypes, enable checkpointing for `full`, hook its blocks and make its optimizer."""
    with torch.device(device_type):
        job = build()
    model = job.model
    if precision == "bf16" and not job.dtypes_set:
        cast_floating(model, torch.bfloat16)
    block_path, blocks = find_blocks(model)
    if recompute == "full":
        if job.enable_recompute is not None:
            job.enable_recompute(model)
        elif blocks:
            checkpoint_blocks(blocks)
        else:
            raise ValueError("recompute: full needs repeated blocks (an nn.ModuleList)")
    model.train()
    widths = _watch_blocks(tracker, blocks)
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    for p in params:
        tracker.parameter_storages[local_tensor(p).untyped_storage()] = True
    return _Prepared(
        job=job,
        block_path=block_path,
        blocks=blocks,
        widths=widths,
        params=params,
        trainable=trainable,
        opt=_make_optimizer(trainable, optimizer),
    )


def _watch_blocks(tracker: Tracker, blocks: list[Any]) -> list[int]:
    """Hooks that set the tracker's scope to the block running (OUTSIDE between blocks), so that
    each storage knows its block; the list they fill with the first block's input width."""
    widths: list[int] = []

    def enter(module: Any, args: Any, index: int) -> None:
        tracker.scope = index
        if not widths and args and isinstance(args[0], torch.Tensor) and args[0].dim():
            widths.append(int(args[0].shape[-1]))  # a block's input width per token

    for index, block in enumerate(blocks):
        block.register_forward_pre_hook(lambda m, a, i=index: enter(m, a, i))
        block.register_forward_hook(lambda m, a, o: setattr(tracker, "scope", OUTSIDE))
    return widths


def _train_step(
    run: _Prepared,
    tracker: Tracker,
    marks: dict[str, Any],
    *,
    amp: bool,
    on_phase_end: Callable[[str], None] | None,
) -> None:
    """One training step: forward to the loss (under autocast for amp), backward, optimizer
    step, zero_grad(set_to_none=True), each a tracker phase. `marks` gets where the step started
    and what forward made and backward left, which the report reads; on_phase_end is called at
    the phases' ends of the measured step only (marks["measured"])."""
    job, model, trainable, opt = run.job, run.job.model, run.trainable, run.opt

    def phase_end(name: str) -> None:
        if on_phase_end is not None and marks.get("measured"):
            on_phase_end(name)

    phase_end("warm-up")
    marks["start_sequence"] = tracker.sequence
    marks["start_bytes"] = tracker.current_bytes
    tracker.phase = "forward"
    with torch.autocast(tracker.device_type, dtype=torch.bfloat16, enabled=amp):
        loss = job.loss(model, job.batch)
    marks["end_of_forward_bytes"] = tracker.current_bytes
    marks["made_in_forward"] = tracker.made_after(marks["start_sequence"])
    phase_end("forward")
    tracker.phase = "backward"
    loss.backward()
    del loss
    phase_end("backward")
    grads = [p.grad for p in trainable]
    marks["gradients_bytes"] = tracker.storages_bytes(grads)
    marks["gradients_at_peak_bytes"] = tracker.storages_bytes(
        grads, after=marks["start_sequence"], until=tracker.peak_sequence.get("backward")
    )
    del grads
    tracker.phase = "optimizer_step"
    opt.step()
    opt.zero_grad(set_to_none=True)
    phase_end("optimizer_step")
    tracker.phase = "idle"


def _optimizer_warm_up(run: _Prepared) -> None:
    """An optimizer step on zero gradients: the optimizer states a step leaves, at half the cost
    of a whole step (checked against the ground truth to the byte)."""
    for p in run.trainable:
        p.grad = torch.zeros_like(p)
    run.opt.step()
    run.opt.zero_grad(set_to_none=True)


def _measurement(
    tracker: Tracker, marks: dict[str, Any], run: _Prepared, *, started: float
) -> dict[str, Any]:
    """The report of the measured step (_report), with the hidden size the blocks saw and the
    reserved peak the allocation log replays to (from the measured step's first event on)."""
    assert tracker.events is not None  # run_step logs the allocations
    states = [v for s in run.opt.state.values() for v in s.values() if torch.is_tensor(v)]
    out = _report(
        tracker,
        marks,
        params=run.params,
        trainable=run.trainable,
        blocks=run.blocks,
        block_path=run.block_path,
        states=states,
        started=started,
    )
    out["hidden_size"] = run.widths[0] if run.widths else 0
    out["peak_reserved_simulated_bytes"] = simulate_reserved(
        tracker.events, reset_peak_at=marks["measured_event"]
    )["peak_reserved_bytes"]
    return out


def _report(
    tracker: Tracker,
    marks: dict[str, Any],
    *,
    params: list[Any],
    trainable: list[Any],
    blocks: list[Any],
    block_path: str,
    states: list[Any],
    started: float,
) -> dict[str, Any]:
    """The measurement as a JSON-able dict."""
    made = marks["made_in_forward"]
    num_layers = len(blocks)
    copies_in_layers = sum(v for k, v in made.items() if isinstance(k, tuple) and k[1] != OUTSIDE)
    copies_outside = made.get(("weight_copy", OUTSIDE), 0)
    in_layers = [made.get(i, 0) for i in range(num_layers)]
    outside = made.get(OUTSIDE, 0)
    parameters_bytes = tracker.storages_bytes(params)
    states_bytes = tracker.storages_bytes(states)
    # Made in forward and alive at its end; storages older than the step that grew meanwhile
    # (FSDP2's all-gathered parameters the root keeps) are not activations.
    activations = sum(made.values())
    regrown = marks["end_of_forward_bytes"] - marks["start_bytes"] - activations
    phases = {
        k: v for k, v in tracker.peaks.items() if k in ("forward", "backward", "optimizer_step")
    }
    fb_phase = max(("forward", "backward"), key=lambda k: phases.get(k, 0))
    return {
        "parameters_bytes": parameters_bytes,
        "gradients_bytes": marks["gradients_bytes"],
        "optimizer_states_bytes": states_bytes,
        "activations_bytes": activations,
        "activations_per_layer_bytes": sum(in_layers) / num_layers if num_layers else 0.0,
        "activations_by_layer_bytes": in_layers,
        "activations_outside_layers_bytes": outside,
        "activations_autocast_weight_copies_bytes": copies_in_layers + copies_outside,
        "activations_autocast_weight_copies_in_layers_bytes": copies_in_layers,
        "unsharded_parameters_at_end_of_forward_bytes": regrown,
        "phases": phases,
        "peak_allocated_bytes": max(phases.values()),
        "peak_phase": max(phases, key=lambda k: phases[k]),
        "transient_bytes": phases.get(fb_phase, 0) - parameters_bytes - states_bytes - activations,
        "transient_phase": fb_phase,
        "gradients_at_peak_bytes": marks["gradients_at_peak_bytes"]
        if fb_phase == "backward"
        else 0,
        "num_layers": num_layers,
        "layer_path": block_path,
        "layer_class": type(blocks[0]).__name__ if blocks else "",
        **_parameter_counts(params, trainable, blocks),
        "elapsed_s": time.perf_counter() - started,
    }


def _parameter_counts(params: list[Any], trainable: list[Any], blocks: list[Any]) -> dict[str, int]:
    """num_parameters, parameters_per_layer (the mean block: an encoder's and a decoder's differ,
    T5's first holds the position bias; rounded down, the remainder counts outside the layers,
    so the two still sum to the total), parameters_outside_layers, trainable_parameters."""
    num_layers = len(blocks)
    in_blocks = sum(p.numel() for block in blocks for p in block.parameters())
    num_per_layer = in_blocks // num_layers if num_layers else 0
    num_total = sum(p.numel() for p in params)
    return {
        "num_parameters": num_total,
        "parameters_per_layer": num_per_layer,
        "parameters_outside_layers": num_total - num_per_layer * num_layers,
        "trainable_parameters": sum(p.numel() for p in trainable),
    }
