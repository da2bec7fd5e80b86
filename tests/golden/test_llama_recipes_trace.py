"""llama-recipes' FSDP1 fine-tune of mid-2023 against one rank's traced step:
tests/data/framework_traces/llama_recipes_fsdp1.json (make_llama_recipes_traces.py: FSDP1 with
use_orig_params False, no MixedPrecision under pure bf16, limit_all_gathers, every decoder
layer checkpointed, eager attention, world 4; a small Llama and Llama-2-7b's own dims at
micro-batch 4 x 2048, the published rows' settings).

The estimate is hf's blocks with FSDP1's terms (hf's rows of FSDP1_FULL_FINETUNE and
FSDP1_LORA switched on, as tests/golden/test_fsdp1_trace.py does: llama-recipes wraps each
trainable leaf, the adapters, as a unit of its own, as verl does, FrameworkSpec.fsdp1_lora).
Tolerances: 4% of peak allocated at the 7B dims (observed -3.1% full, -1.2% LoRA; before the
eager softmax-backward moment, engine/_recompute.py eager_softmax_backward_bytes, they were
-7.8% and -7.7%; LoRA was +1.7% under FSDP2's terms, an extra gathered block and a fp32
reduce-scatter input the trace does not hold); the small model's full fine-tunes 3% (observed
-1.9%, -2.1%); its LoRA case 8% (observed +7.3%, +18.5% under FSDP2's terms: at 512 tokens the
per-block terms the engine reads off transformers' blocks dominate, the LoRA block's working
set at this size is left as it is).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.golden.test_fsdp1_trace import _estimate as fsdp1_estimate

TRACE = Path(__file__).parents[1] / "data" / "framework_traces" / "llama_recipes_fsdp1.json"
CASES = {c["case"]: c for c in json.loads(TRACE.read_text())["cases"]}
TOLERANCE = {"full": 0.03, "mixed": 0.03, "full-7b": 0.04, "lora-7b": 0.04, "lora": 0.08}
"""Relative tolerance of peak allocated per case (observed errors in the module docstring)."""


def _estimate(case: dict, monkeypatch) -> dict:
    return fsdp1_estimate(case, monkeypatch, fsdp1=True, attention=case["attention"])


@pytest.mark.parametrize("name", sorted(TOLERANCE))
def test_llama_recipes_peak_within_tolerance(name, monkeypatch) -> None:
    case = CASES[name]
    got = _estimate(case, monkeypatch)
    assert got["peak_allocated_bytes"] == pytest.approx(
        case["peak_allocated_bytes"], rel=TOLERANCE[name]
    )


def test_the_7b_backward_peak_holds_three_fp32_score_tensors() -> None:
    """At Llama-2-7b's dims the traced backward peak is the softmax backward of a recomputed
    layer: the fp32 softmax output, the fp32 gradient of the probabilities and the softmax
    backward's fp32 output, one [4, 32, 2048, 2048] fp32 tensor each (2 GiB)."""
    live = CASES["lora-7b"]["live_at_backward_peak_by_category"]
    scores = 4 * 4 * 32 * 2048 * 2048
    for op in ("_softmax", "_to_copy", "_softmax_backward_data"):
        assert live[f"{op} [4, 32, 2048, 2048] float32"] == scores, op
