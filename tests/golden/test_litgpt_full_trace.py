"""The engine's `--framework litgpt` full fine-tune (no LoRA) against exact traces of LitGPT
0.5.13's own finetune/full.py step.

tests/data/framework_traces/litgpt_full.json (make_litgpt_full_traces.py says how): litgpt's GPT
(the small Llama of litgpt_lora.json, every parameter trained) under bf16-true, torch AdamW
(foreach), with and without per-Block checkpointing, micro-batch 1 and 2 at 1,024 tokens, and
two rows at vocabulary 32,768 (seq 512), where the loss's [T, v] tensors weigh. full.py runs ONE
head over the sequence (`logits = model(input_ids)`), not lora.py's 128-token chunks
(FrameworkSpec.head_chunk_lora_only), and its `logits` local keeps the fp32 logits through the
optimizer step (engine/_loss.py loop_held_step_logits_bytes). No torch needed: the traced
figures are data.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.framework_accuracy import estimate_litgpt_full

DATA = Path(__file__).parents[1] / "data" / "framework_traces"
CASES = json.loads((DATA / "litgpt_full.json").read_text())["cases"]
SMALL_VOCAB = [c for c in CASES if c["dims"]["vocab"] == 2048]
BIG_VOCAB = [c for c in CASES if c["dims"]["vocab"] == 32768]

PEAK_TOLERANCE = 0.03
"""The project's target for a traced peak (ACCURACY.md). Observed at vocabulary 2,048: -1.8% /
-2.3% without checkpointing (micro-batch 1 / 2), -0.4% / -1.3% with (2 [T, v] or less: at this
vocabulary the blocks set the moments); with lora.py's chunked head applied to these rows (the
engine before head_chunk_lora_only) -3.7% / -4.5% / +5.2% / +7.2%."""
BIG_VOCAB_TOLERANCE = 0.005
"""At vocabulary 32,768 every phase's peak is within 0.42% (forward -0.42%, backward -0.37%
without checkpointing; 0.03% or less with): 0.13 [T, v] at most."""
STEP_TOLERANCE = 0.0005
"""The optimizer step's peak: the states, the gradients and the held fp32 logits, exact to the
small tensors' rounding (0.01% observed); without the held logits 4 [T, v] under (-12.8% at
vocabulary 32,768, where it is the step's peak with checkpointing)."""
FORWARD_UNDER = 0.05
"""(Vocabulary 2,048.) Without checkpointing the forward peak is under by 1.9% / 4.5% (2 / 4
[T, v]; at micro-batch 2 it is the step's peak, yet the step is within PEAK_TOLERANCE as the
backward's estimate covers it): the previous step's fp32 logits, alive in the next forward
until it returns, are not counted (loop_held_step_logits_bytes says so)."""
FORWARD_OVER = 0.08
"""(Vocabulary 2,048.) With checkpointing the forward peak is over by 5.5-7.3% (the generic
full loss's forward moment; not the step's peak, which is backward, within PEAK_TOLERANCE)."""


_estimate = estimate_litgpt_full
"""The engine's columns for a case, as the README's accuracy table computes them."""


def _case_id(c: dict[str, Any]) -> str:
    return f"v{c['dims']['vocab']}-ac{int(c['ac'])}-b{c['micro_batch_size']}"


def test_the_traces_are_full_fine_tunes_of_the_lora_model() -> None:
    """Every parameter trained: the gradients are the parameters, AdamW's two states twice
    that, all bf16 (bf16-true); both AC settings, two micro-batches, two vocabularies."""
    assert {(c["ac"], c["micro_batch_size"]) for c in SMALL_VOCAB} == {
        (False, 1),
        (False, 2),
        (True, 1),
        (True, 2),
    }
    assert {(c["ac"], c["micro_batch_size"], c["seq_len"]) for c in BIG_VOCAB} == {
        (False, 1, 512),
        (True, 1, 512),
    }
    for c in CASES:
        assert c["gradients_bytes"] == c["parameters_bytes"] == 2 * c["num_parameters"]
        assert c["optimizer_states_bytes"] == 2 * c["parameters_bytes"]


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_states_are_exact(case: dict[str, Any]) -> None:
    got = _estimate(case)
    assert got["parameters"] == case["parameters_bytes"]
    assert got["gradients_total"] == case["gradients_bytes"]  # `gradients`: at the peak
    assert got["optimizer_states"] == case["optimizer_states_bytes"]


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_peak_allocated_within_tolerance(case: dict[str, Any]) -> None:
    got = _estimate(case)
    err = got["peak_allocated_bytes"] / case["peak_allocated_bytes"] - 1.0
    assert abs(err) <= PEAK_TOLERANCE, f"peak allocated {err:+.2%}"
    backward = got["peak_backward_bytes"] / case["peak_backward_bytes"] - 1.0
    assert abs(backward) <= PEAK_TOLERANCE, f"backward peak {backward:+.2%}"


@pytest.mark.parametrize("case", SMALL_VOCAB, ids=_case_id)
def test_forward_peak_bounded(case: dict[str, Any]) -> None:
    got = _estimate(case)
    err = got["peak_forward_bytes"] / case["peak_forward_bytes"] - 1.0
    if case["ac"]:
        assert 0.0 < err <= FORWARD_OVER, f"forward peak {err:+.2%}"
    else:
        assert -FORWARD_UNDER <= err < 0.0, f"forward peak {err:+.2%}"


@pytest.mark.parametrize("case", BIG_VOCAB, ids=_case_id)
def test_big_vocabulary_phases(case: dict[str, Any]) -> None:
    got = _estimate(case)
    for phase in ("forward", "backward", "optimizer_step"):
        key = f"peak_{phase}_bytes"
        err = got[key] / case[key] - 1.0
        assert abs(err) <= BIG_VOCAB_TOLERANCE, f"{phase} peak {err:+.2%}"


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_optimizer_step_holds_the_fp32_logits(case: dict[str, Any]) -> None:
    got = _estimate(case)
    err = got["peak_optimizer_step_bytes"] / case["peak_optimizer_step_bytes"] - 1.0
    assert abs(err) <= STEP_TOLERANCE, f"optimizer-step peak {err:+.3%}"
    held = 4.0 * case["tokens"] * case["dims"]["vocab"]
    assert (
        case["peak_optimizer_step_bytes"]
        - (case["parameters_bytes"] + case["gradients_bytes"] + case["optimizer_states_bytes"])
        >= held
    )  # the trace itself holds them: not a constant tuned in


def test_the_lora_recipe_still_chunks_its_head() -> None:
    """head_chunk_lora_only leaves lora.py's rows as they were (test_litgpt_trace.py checks
    their numbers): 128-token chunks with an adapter, one head without; other frameworks'
    rows keep their own setting."""
    from trainmem.engine._frameworks import FRAMEWORKS, head_chunk_tokens

    litgpt, hf = FRAMEWORKS.index("litgpt"), FRAMEWORKS.index("hf")
    got = head_chunk_tokens([litgpt, litgpt, hf, hf], [16, 0, 16, 0])
    assert got.tolist() == [128.0, 0.0, 0.0, 0.0]
