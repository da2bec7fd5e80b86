"""`trainmem explain`'s reading and attribution of memory snapshots (report/_snapshot.py,
report/_attribute.py) on the torch-format fixtures of tests/data/snapshots (see their make_*.py:
linear_adamw and oom are built to torch 2.13's structure by hand; torch_profiler_cpu is written
by torch's own torch.cuda._memory_viz._profile_to_snapshot, with torch's category of every
allocation), and its safety on hostile files."""

from __future__ import annotations

import collections
import os
import pickle
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainmem.engine import COMPONENTS
from trainmem.report._attribute import attribute, frame_kind
from trainmem.report._snapshot import load_snapshot, replay, rounded

DATA = Path(__file__).resolve().parents[2] / "data" / "snapshots"
MIB = 1 << 20
WEIGHT, BIAS, BATCH = 2048 * 2048 * 4, 2048 * 4, 64 * 2048 * 4  # make_torch_format.py's


def _measured(name: str) -> dict:
    return attribute(replay(load_snapshot(str(DATA / name))))


def test_linear_adamw_attributed_as_built() -> None:
    """Every component of the hand-built two-step loop, to the byte (make_torch_format.py)."""
    got = _measured("linear_adamw.pickle")
    m = got["measured"]
    assert m["parameters"] == WEIGHT + BIAS
    assert m["gradients"] == WEIGHT + BIAS
    assert m["optimizer_states"] == 2 * (WEIGHT + BIAS)
    assert m["activations"] == 2 * BATCH + 512  # the batch, the linear's output, the loss
    assert m["framework_overhead"] == 32 * MIB  # the cuBLAS workspace
    assert m["transient"] == WEIGHT + BIAS  # foreach AdamW's temporaries at the peak
    assert (
        got["peak_allocated_bytes"]
        == sum(got["measured_at_peak"].values()) - (got["measured_at_peak"]["fragmentation"])
    )
    assert set(m) == set(COMPONENTS)


def test_oom_dump_ends_in_backward() -> None:
    """The OOM entry is found; the backward working set alive at the dump is not gradients."""
    replayed = replay(load_snapshot(str(DATA / "oom.pickle")))
    assert replayed.oom is not None and replayed.oom["requested_bytes"] == WEIGHT
    m = attribute(replayed)["measured"]
    assert m["gradients"] == 0
    assert m["parameters"] == WEIGHT + BIAS
    assert m["activations"] == 2 * BATCH + 512


def test_torch_profiler_snapshot_matches_torch_categories() -> None:
    """A snapshot torch wrote (its memory profiler's categories on every alloc entry):
    parameters, gradients and optimizer states within 1% of torch's own; activations (torch
    counts every autograd-graph tensor while alive, trainmem what is alive when backward
    starts) within 20%."""
    snapshot = load_snapshot(str(DATA / "torch_profiler_cpu.pickle"))
    mine = attribute(replay(snapshot))["measured"]
    theirs = _torch_category_peaks(snapshot)
    for component, category in (
        ("gradients", "gradient"),
        ("optimizer_states", "optimizer_state"),
        ("activations", "activation"),
    ):
        tolerance = 0.20 if component == "activations" else 0.01
        assert mine[component] == pytest.approx(theirs[category], rel=tolerance), component
    # the parameters existed before the profiler started: the segments' blocks of that category
    assert mine["parameters"] == pytest.approx(4 * (2 * 512 * 1024 + 1024 + 512), rel=0.01)


def _torch_category_peaks(snapshot: dict) -> dict[str, int]:
    """The largest live bytes of each torch category over the trace (its alloc entries)."""
    live: dict[int, tuple[int, str]] = {}
    now: collections.Counter = collections.Counter()
    peak: collections.Counter = collections.Counter()
    for e in snapshot["device_traces"][-1]:
        if e["action"] == "alloc":
            live[e["addr"]] = (rounded(e["size"]), e["category"])
            now[e["category"]] += rounded(e["size"])
            peak[e["category"]] = max(peak[e["category"]], now[e["category"]])
        elif e["action"] == "free_completed" and e["addr"] in live:
            size, category = live.pop(e["addr"])
            now[category] -= size
    return dict(peak)


@pytest.mark.parametrize(
    ("frames", "kind"),
    [
        ([("x/torch/optim/adamw.py", "_init_group")], "optimizer"),
        ([("??", "torch::autograd::Engine::thread_main(...)")], "backward"),
        ([("none", "torch/autograd/graph.py(966): _engine_run_backward")], "backward"),
        (
            [
                ("a/torch/nn/modules/linear.py", "forward"),
                ("a/torch/nn/modules/module.py", "_call_impl"),
            ],
            "forward",
        ),
        ([("a/torch/nn/modules/module.py", "_apply")], "setup"),
        ([("??", "c10d::ProcessGroupNCCL::allreduce(...)")], "overhead"),
        ([("x/torch/distributed/fsdp/_fully_shard/_fsdp_param.py", "c10d all_gather")], "unknown"),
        (
            [
                (
                    "/pytorch/aten/src/ATen/cuda/CublasHandlePool.cpp",
                    "at::cuda::getCUDABlasLtWorkspace()",
                )
            ],
            "overhead",
        ),
        ([("trainmem: end of forward", "activations")], "activations"),
        ([("train.py", "<module>")], "unknown"),
    ],
)
def test_frame_kinds(frames: list, kind: str) -> None:
    assert frame_kind(tuple(frames)) == kind


class _Payload:
    """Unpickling this would create a file: the reader must refuse it before."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (self.path, "w"))


def test_a_pickle_with_code_is_refused_and_not_run(tmp_path: Path) -> None:
    target = tmp_path / "created"
    bad = tmp_path / "evil.pickle"
    bad.write_bytes(pickle.dumps({"segments": [_Payload(str(target))]}))
    with pytest.raises(ValueError, match=r"^snapshot: .*refuses the global"):
        load_snapshot(str(bad))
    assert not target.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not a pickle at all", "not a"),
        (pickle.dumps([1, 2, 3]), "segments\\[0\\] must be a dict"),
        (pickle.dumps({"blocks": []}), "expected a dict with 'segments'"),
        (
            pickle.dumps({"segments": [{"address": 1, "total_size": "big"}]}),
            "total_size must be an integer",
        ),
        (
            pickle.dumps({"segments": [], "device_traces": [[{"action": "boom"}]]}),
            r"device_traces\[0\]\[0\].action must be one of",
        ),
        (pickle.dumps(collections.OrderedDict()), "refuses the global"),
    ],
)
def test_bad_files_are_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.pickle"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as info:
        load_snapshot(str(path))
    assert "\n" not in str(info.value)


def test_size_cap_and_non_files(tmp_path: Path) -> None:
    big = tmp_path / "big.pickle"
    big.write_bytes(pickle.dumps({"segments": [], "pad": "x" * 4096}))
    with pytest.raises(ValueError, match="larger than"):
        load_snapshot(str(big), cap_bytes=1024)
    with pytest.raises(ValueError, match="is a folder"):
        load_snapshot(str(tmp_path))
    with pytest.raises(ValueError, match="no such file"):
        load_snapshot(str(tmp_path / "missing.pickle"))
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        with pytest.raises(ValueError, match="not a regular file"):
            load_snapshot(str(fifo))


def test_segments_only_snapshot_has_a_warning(tmp_path: Path) -> None:
    """torch.cuda.memory_snapshot()'s list of segments: its live blocks, said to be so."""
    snapshot = load_snapshot(str(DATA / "linear_adamw.pickle"))
    path = tmp_path / "segments.pickle"
    path.write_bytes(pickle.dumps(snapshot["segments"]))
    replayed = replay(load_snapshot(str(path)))
    assert replayed.warnings and "no allocation history" in replayed.warnings[0]
    got = attribute(replayed)
    assert got["peak_allocated_bytes"] == sum(
        b["size"] for s in snapshot["segments"] for b in s["blocks"] if b["state"] != "inactive"
    )


def test_allocator_settings_mismatch_is_a_warning(tmp_path: Path) -> None:
    """An empty snapshot of an expandable-segments run: no calibration, two warnings."""
    from trainmem.engine import Overheads
    from trainmem.report import estimate_report
    from trainmem.report._explain import explain_report

    path = tmp_path / "empty.pickle"
    settings = {"expandable_segments": True}
    path.write_bytes(
        pickle.dumps({"segments": [], "device_traces": [[]], "allocator_settings": settings})
    )
    predicted = estimate_report(advice=False)
    out = explain_report(
        str(path), predicted=predicted, overheads=Overheads(), gpu_memory_bytes=80 << 30
    )
    assert out["calibration"] == {}
    assert any("--allocator expandable-segments" in w for w in out["warnings"])
    assert out["measured_peaks"]["peak_allocated_bytes"] == 0


_STACKS = (
    [],
    [{"filename": "a/torch/nn/modules/module.py", "line": 1, "name": "_call_impl"}],
    [{"filename": "??", "line": 0, "name": "torch::autograd::Engine::thread_main(...)"}],
    [{"filename": "a/torch/optim/adamw.py", "line": 1, "name": "_init_group"}],
    [{"filename": "a/torch/nn/modules/module.py", "line": 1, "name": "_apply"}],
    [{"filename": "train.py", "line": 1, "name": "<module>"}],
)


def _random_snapshot(ops: list[tuple[bool, int, int, int]]) -> dict:
    """A trace of allocs and frees (op: alloc?, which live one / size in KiB, stack) with one
    segment per allocation (reserved never below allocated)."""
    trace, live, address = [], [], 1 << 40
    for is_alloc, pick, kib, stack in ops:
        if is_alloc or not live:
            size = kib * 1024 + 1
            trace.append({"action": "segment_alloc", "addr": address, "size": 1 << 30})
            trace.append(
                {"action": "alloc", "addr": address, "size": size, "frames": _STACKS[stack]}
            )
            live.append((address, size, stack))
            address += 1 << 30
        else:
            addr, size, stack = live.pop(pick % len(live))
            for action in ("free_requested", "free_completed"):
                trace.append(
                    {"action": action, "addr": addr, "size": size, "frames": _STACKS[stack]}
                )
    segments = [
        {
            "address": a,
            "total_size": 1 << 30,
            "blocks": [{"address": a, "size": s, "state": "active_allocated"}],
        }
        for a, s, _ in live
    ]
    return {"segments": segments, "device_traces": [trace]}


@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 50), st.integers(0, 4096), st.integers(0, 5)),
        max_size=60,
    )
)
def test_attribution_laws(ops: list[tuple[bool, int, int, int]]) -> None:
    """Every component >= 0; the breakdown at the peak sums to the peak (allocated, then
    reserved with the fragmentation); no component's largest exceeds the allocated peak."""
    from trainmem.report._snapshot import check_snapshot

    got = attribute(replay(check_snapshot(_random_snapshot(ops))))
    at_peak = got["measured_at_peak"]
    assert all(v >= 0 for v in (*got["measured"].values(), *at_peak.values()))
    allocated = sum(v for k, v in at_peak.items() if k != "fragmentation")
    assert allocated == got["peak_allocated_bytes"]
    assert allocated + at_peak["fragmentation"] == got["peak_reserved_bytes"]
    for component in ("parameters", "gradients", "optimizer_states", "framework_overhead"):
        assert got["measured"][component] <= got["peak_allocated_bytes"]
