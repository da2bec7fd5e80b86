"""The tracer's memory snapshot (trace/_snapshot.py) read back by `trainmem explain`'s
attribution: every component within 1% of the tracer's own categories (and the peaks of the
same replay), and torch's own viewer code reads the file (torch.cuda._memory_viz)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="trainmem[trace] not installed: pip install 'trainmem[trace]'")
pytest.importorskip("transformers", reason="trainmem[trace] not installed")

from trainmem.report._attribute import attribute  # noqa: E402
from trainmem.report._snapshot import load_snapshot, replay  # noqa: E402
from trainmem.trace._core import trace_step  # noqa: E402

TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
}
CASES = [
    ("amp-bf16", "none", "adamw"),
    ("bf16", "full", "adamw"),
    ("fp32", "none", "sgd-momentum"),
]
CATEGORIES = {
    "parameters": "parameters_bytes",
    "gradients": "gradients_bytes",
    "optimizer_states": "optimizer_states_bytes",
    "activations": "activations_bytes",
}


@pytest.mark.parametrize(("precision", "recompute", "optimizer"), CASES)
def test_explain_attributes_a_traced_snapshot_within_1_percent(
    tmp_path: Path, precision: str, recompute: str, optimizer: str
) -> None:
    path = tmp_path / "step.pickle"
    traced = trace_step(
        TINY_LLAMA,
        micro_batch_size=2,
        seq_len=64,
        precision=precision,
        recompute=recompute,
        attention="flash",
        optimizer=optimizer,
        snapshot=str(path),
    )
    got = attribute(replay(load_snapshot(str(path))))
    for component, key in CATEGORIES.items():
        assert got["measured"][component] == pytest.approx(traced[key], rel=0.01), component
    assert got["peak_allocated_bytes"] == pytest.approx(traced["peak_allocated_bytes"], rel=0.01)
    assert got["peak_reserved_bytes"] == traced["peak_reserved_simulated_bytes"]


def test_torch_memory_viz_reads_a_traced_snapshot(tmp_path: Path) -> None:
    """torch's own snapshot code (the viewer's summaries) takes the traced file as its own."""
    from torch.cuda import _memory_viz

    path = tmp_path / "step.pickle"
    trace_step(
        TINY_LLAMA,
        micro_batch_size=1,
        seq_len=32,
        precision="bf16",
        recompute="none",
        attention="flash",
        optimizer="adamw",
        snapshot=str(path),
    )
    with open(path, "rb") as f:
        snapshot = pickle.load(f)  # written by the test just now
    assert "segment" in _memory_viz.segsum(snapshot)
    assert "<html" in _memory_viz.trace_plot(snapshot).lower()


def test_trace_cli_writes_a_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`trainmem trace --snapshot FILE` (one model, one fake device); refused with --num-gpus."""
    from trainmem.cli import main

    config = Path(__file__).resolve().parents[2] / "data" / "snapshots" / "tiny_llama.json"
    path = tmp_path / "sub" / "step.pickle"
    argv = ["trace", "--model", str(config), "--seq-len", "32", "--micro-batch-size", "1"]
    assert main([*argv, "--snapshot", str(path), "--json"]) == 0
    traced = json.loads(capsys.readouterr().out)
    got = attribute(replay(load_snapshot(str(path))))
    assert got["peak_allocated_bytes"] == traced["measured"]["peak_allocated_bytes"]
    assert main([*argv, "--num-gpus", "2", "--zero", "3", "--snapshot", str(path)]) == 2
    assert capsys.readouterr().err.startswith("error: snapshot: ")
