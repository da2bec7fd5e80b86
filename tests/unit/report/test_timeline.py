"""The step timeline (report/_timeline.py) and its PyTorch memory snapshot
(report/_memory_snapshot.py) hold the estimate's own peaks exactly: the timeline's largest total
is peak_allocated_bytes, each phase's largest is that phase's peak, and the snapshot's
allocations and frees, replayed as torch's viewer replays them, peak at the same bytes."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from trainmem.catalog import load_model
from trainmem.report import (
    TIMELINE_COMPONENTS,
    estimate_report,
    memory_snapshot,
    picture_suffix,
    stage_blocks,
    step_timeline,
)

CASES = [
    {},
    {"num_gpus": 8, "zero": 3, "recompute": "full", "micro_batch_size": 4},
    {"num_gpus": 8, "zero": 2, "recompute": "selective", "global_batch_size": 64},
    {"num_gpus": 4, "pp": 2, "tp": 2, "global_batch_size": 32, "framework": "megatron"},
    {"lora_rank": 16, "seq_len": 4096},
    {"num_gpus": 8, "zero": 3, "offload": "optimizer", "micro_batch_size": 2},
]


def _timeline(case: dict, model: str = "llama-3.1-8b") -> tuple[dict, dict]:
    report = estimate_report(case, model=model)
    spec = load_model(model, models_dir=None)
    blocks = stage_blocks(spec.num_hidden_layers, report["config"]["pp"])
    return report, step_timeline(report, num_blocks=blocks)


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_timeline_peaks_are_the_estimates(case: dict) -> None:
    report, t = _timeline(case)
    total = t["total_bytes"]
    assert int(total.max()) == report["peak_allocated_bytes"]
    assert int(total[t["peak_moment"]]) == report["peak_allocated_bytes"]
    phases = np.asarray(t["phases"])
    for phase, peak in report["phases"].items():
        assert int(total[phases == phase].max()) == peak, phase
    parts = np.array([t[k] for k in TIMELINE_COMPONENTS])
    assert (parts >= 0).all()
    assert (parts.sum(axis=0) == total).all()
    # forward block by block, backward block by block
    num_blocks = stage_blocks(32, report["config"]["pp"])
    assert sum(m.startswith("forward block") for m in t["moments"]) == num_blocks
    assert sum(m.startswith("backward block") for m in t["moments"]) == num_blocks


def test_activations_grow_in_forward_and_shrink_in_backward() -> None:
    _, t = _timeline({"num_gpus": 8, "zero": 3, "recompute": "full", "micro_batch_size": 4})
    phases = np.asarray(t["phases"])
    acts, grads = t["activations"], t["gradients"]
    assert (np.diff(acts[phases == "forward"]) >= 0).all()
    assert (np.diff(acts[phases == "backward"]) <= 0).all()
    assert (np.diff(grads[phases == "backward"]) >= 0).all()
    assert "recompute block" in t["moments"]


def _replay(snapshot: dict) -> int:
    """The largest bytes alive, as torch's MemoryViz.js counts them: `alloc` adds, a
    `free_completed` of an allocation removes; active blocks of the segments with no alloc in
    the trace were alive before it."""
    alive, peak, traced = 0, 0, set()
    for e in snapshot["device_traces"][0]:
        if e["action"] == "alloc":
            alive += e["size"]
            traced.add(e["addr"])
        elif e["action"] == "free_completed":
            alive -= e["size"]
            traced.discard(e["addr"])
        peak = max(peak, alive)
    before = sum(
        b["size"]
        for s in snapshot["segments"]
        for b in s["blocks"]
        if b["state"] == "active_allocated" and b["address"] not in traced
    )
    assert before == 0  # every allocation is in the trace
    return peak


@pytest.mark.parametrize("case", CASES[:4], ids=str)
def test_memory_snapshot_peaks_at_the_estimate(case: dict) -> None:
    report, t = _timeline(case)
    snapshot = pickle.loads(pickle.dumps(memory_snapshot(t)))
    assert _replay(snapshot) == report["peak_allocated_bytes"]
    (segment,) = snapshot["segments"]
    assert sum(b["size"] for b in segment["blocks"]) == segment["total_size"]
    assert segment["total_size"] >= report["peak_allocated_bytes"]


def test_torch_memory_viz_reads_the_snapshot() -> None:
    memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    report, t = _timeline({"num_gpus": 8, "zero": 3, "recompute": "full"})
    snapshot = pickle.loads(pickle.dumps(memory_snapshot(t)))
    text = memory_viz.trace(snapshot)  # torch's own reading of every event
    assert f"{len(snapshot['device_traces'][0])} entries" in text
    assert "Segment size mismatch" not in memory_viz.segsum(snapshot)
    html = memory_viz.trace_plot(snapshot)
    assert "Active Memory Timeline" in html
    lines = memory_viz.memory(snapshot, format_flamegraph=lambda lines: lines)
    alive_at_end = sum(
        int(line.rsplit(" ", 1)[1]) for line in lines.splitlines() if "active_allocated" in line
    )
    assert alive_at_end == int(t["total_bytes"][-1])  # what the step leaves allocated
    assert _replay(snapshot) == report["peak_allocated_bytes"]


def test_picture_suffix_names_the_flag() -> None:
    assert picture_suffix("--plot", "a/b.PNG", ("png", "svg")) == "png"
    with pytest.raises(ValueError, match=r"^--plot: .*'a\.jpg'.*allowed: \.png, \.svg$"):
        picture_suffix("--plot", "a.jpg", ("png", "svg"))
    with pytest.raises(ValueError, match="--memory-viz"):
        picture_suffix("--memory-viz", "dir.v1/snapshot", ("pickle", "pkl"))
