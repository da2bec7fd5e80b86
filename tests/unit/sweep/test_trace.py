"""`trainmem trace` on fake tensors (needs the trace extra: torch + transformers).

Skipped, with the reason, where torch or transformers is not installed (the core install).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="trainmem[trace] not installed: pip install 'trainmem[trace]'")
pytest.importorskip("transformers", reason="trainmem[trace] not installed")

from trainmem.sweep._trace import trace_step  # noqa: E402

GROUNDTRUTH = Path(__file__).resolve().parents[2] / "data" / "groundtruth"
# Llama-family single-GPU ground truth that the CPU fake-tensor trace reproduces (see the module
# docstring of sweep/_trace.py for the GPT-2 gaps). Small ones, to keep the suite fast.
CASES = [
    "llama-3.2-1b_fp32_s1024_mb4_eager",
    "llama-3.2-1b_amp_s2048_mb2",
    "tinyllama-1.1b_bf16_s2048_mb8_ckpt",
]


@pytest.mark.parametrize("name", CASES)
def test_trace_reproduces_the_ground_truth(name: str) -> None:
    case = json.loads((GROUNDTRUTH / f"{name}.json").read_text())
    t = case["training"]
    got = trace_step(
        case["model_config"],
        micro_batch_size=t["micro_batch_size"],
        seq_len=t["seq_len"],
        precision=t["precision"],
        recompute=t["recompute"],
        attention=t["attention"],
        optimizer=t["optimizer"],
    )
    want = case["bytes"]
    assert got["parameters_bytes"] == want["parameters"]
    assert got["optimizer_states_bytes"] == want["optimizer_states"]
    # 1%: the bound for trace against the ground truth.
    assert got["activations_bytes"] == pytest.approx(want["activations"], rel=0.01)
    assert got["peak_allocated_bytes"] == pytest.approx(want["peak_allocated"], rel=0.01)
