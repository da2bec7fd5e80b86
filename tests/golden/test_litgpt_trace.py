"""The engine's `--framework litgpt` against exact traces of LitGPT 0.5.13's own LoRA step.

tests/data/framework_traces/litgpt_lora.json: litgpt.lora.GPT (a small Llama: fused qkv,
LitGPT's RMSNorm, k/v repeated to the query heads) under bf16-true, LoRA rank 16 with LitGPT's
default dropout 0.05, its fit loop's head over 128-token chunks (cast to fp32 by Fabric's
convert_output) and chunked_cross_entropy,
torch AdamW (foreach), traced on the fake CUDA device (make_litgpt_traces.py says how). No
torch needed: the traced figures are data.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.framework_accuracy import estimate_litgpt

DATA = Path(__file__).parents[1] / "data" / "framework_traces" / "litgpt_lora.json"
ALL_CASES = json.loads(DATA.read_text())["cases"]
CASES = [c for c in ALL_CASES if c["precision"] == "bf16"]
"""bf16-true (the model, adapters included, in bf16)."""
AMP_CASES = [c for c in ALL_CASES if c["precision"] == "amp-bf16"]
"""bf16-mixed (LitGPT's default without --precision): an fp32 model under autocast."""


def _case_id(c: dict[str, Any]) -> str:
    targets = "qv" if not c["targets"]["lora_mlp"] else "all"
    return f"{c['precision']}-ac{int(c['ac'])}-{targets}-dropout{c['lora_dropout']:g}"


def _held_logits_bytes(c: dict[str, Any]) -> float:
    """fit's list of logits, fp32 (Fabric's convert_output casts the chunks): made in forward,
    so in the trace's activations; the engine counts it apart (alive in every phase,
    engine/_loss.py LOOP_HELD_LOGITS)."""
    return 4.0 * c["tokens"] * c["dims"]["vocab"]


LAYER_TOLERANCE = 0.026
"""A block (layers 1..3; layer 0 keeps less: its input, the frozen embedding's output, needs no
gradient, so its first norm keeps no fp32 copy and its q/v dropout no mask, which the engine
does not single out) is exact with LitGPT's default dropout; the dropout-0 case is +2.58%: the
engine models the recipe's default (one bool mask per adapted module), which that case turns
off."""
ACTIVATIONS_TOLERANCE = 0.047
"""Whole-step activations: layer 0's smaller saves (above), +2.1% to +2.9% with the default
dropout; +4.7% with dropout off."""
OUTSIDE_TOLERANCE = 0.0005
"""The head side: final norm's fp32 copy, each chunk's bf16 log-softmax, the held logits
(+0.02%: int64 label chunks the engine counts once as [T])."""
PEAK_TOLERANCE = 0.036
"""Allocated peak (forward without checkpointing: at the end of the head, fit's previous fp32
logits, the new chunks and their fp32 casts alive together; backward with it): +1.7% to +2.2%
with the default dropout, +3.6% with dropout off (the bool masks above), +1.9% with
checkpointing (the recompute moment is modelled on layer 0's end-of-backward transients)."""
FORWARD_TOLERANCE = 0.036
"""Forward peak without checkpointing: +1.7% to +3.6% (as the peak). With checkpointing the
engine's checkpointed-block working set (FORWARD_WORKING_FREED_TF, read off transformers
traces) is +22% over LitGPT's block; not asserted there."""


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_litgpt_lora_step(case: dict[str, Any]) -> None:
    got = estimate_litgpt(case)
    # bf16 base, bf16 adapters (r (d_in + d_out) per adapted q/k/v part), their bf16
    # gradients and two bf16 AdamW states each: exact.
    assert got["parameters"] == case["parameters_bytes"]
    assert got["gradients_total"] == case["gradients_bytes"]
    assert got["optimizer_states"] == case["optimizer_states_bytes"]
    held = _held_logits_bytes(case)
    saved = (got["activations_total"] + held) / case["activations_bytes"] - 1.0
    assert 0.0 <= saved <= ACTIVATIONS_TOLERANCE, saved
    outside = (got["activations_outside_layers"] + held) / case[
        "activations_outside_layers_bytes"
    ] - 1.0
    assert abs(outside) <= OUTSIDE_TOLERANCE, outside
    if not case["ac"]:
        layers = case["activations_by_layer_bytes"][1:]
        assert len(set(layers)) == 1, layers
        layer = got["activations_per_layer"] / layers[0] - 1.0
        assert 0.0 <= layer <= LAYER_TOLERANCE, layer
        if case["lora_dropout"] > 0:
            assert got["activations_per_layer"] == layers[0]
        forward = got["peak_forward_bytes"] / case["peak_forward_bytes"] - 1.0
        assert abs(forward) <= FORWARD_TOLERANCE, forward
    peak = got["peak_allocated_bytes"] / case["peak_allocated_bytes"] - 1.0
    assert abs(peak) <= PEAK_TOLERANCE, peak
    assert case["peak_phase"] == ("backward" if case["ac"] else "forward")
    assert got["peak_phase"] == (1.0 if case["ac"] else 0.0)
    # The optimizer step holds fit's logits (and the fp32 rope buffers): within 0.1%.
    opt = got["peak_optimizer_step_bytes"] / case["peak_optimizer_step_bytes"] - 1.0
    assert abs(opt) <= 0.001, opt


AMP_TOLERANCE = 0.05
"""bf16-mixed, not tuned: a block +5.1% (the engine's autocast terms are read off transformers
traces: LitGPT's RMSNorm on an fp32 residual keeps no copy), the whole step's activations -4.0%:
on the fake device each chunk's loss keeps a bf16 log-softmax and an fp32 copy of it (autocast
upcasting at nll_loss) where the engine counts the fp32 log-softmax of torch's CUDA autocast
list (cross_entropy_loss in fp32), -12% of the head side; not checked on a GPU. Peaks within
2.9%."""


@pytest.mark.parametrize("case", AMP_CASES, ids=_case_id)
def test_litgpt_lora_step_bf16_mixed(case: dict[str, Any]) -> None:
    got = estimate_litgpt(case)
    # fp32 model under autocast: fp32 adapters, gradients and AdamW states, exact.
    assert got["parameters"] == case["parameters_bytes"]
    assert got["gradients_total"] == case["gradients_bytes"]
    assert got["optimizer_states"] == case["optimizer_states_bytes"]
    saved = (got["activations_total"] + _held_logits_bytes(case)) / case["activations_bytes"]
    assert abs(saved - 1.0) <= AMP_TOLERANCE, saved
    layer = got["activations_per_layer"] / case["activations_by_layer_bytes"][1] - 1.0
    assert abs(layer) <= AMP_TOLERANCE + 0.002, layer  # +5.1%
    for key in ("peak_forward_bytes", "peak_backward_bytes", "peak_allocated_bytes"):
        err = got[key] / case[key] - 1.0
        assert abs(err) <= 0.03, (key, err)


def test_litgpt_loss_keeps_fp32_log_probs() -> None:
    # What the trace shows chunked_cross_entropy keeps: one fp32 [b * 128, v] log-softmax per
    # chunk (Fabric's convert_output cast the chunks to fp32 first), and the fit loop's fp32
    # logits (the casts); 8 chunks of 2 x 128 tokens here.
    case = CASES[0]
    outside = case["saved_at_end_of_forward"]["outside"]
    log_probs = [s for s in outside if s.startswith("_log_softmax")]
    assert len(log_probs) == case["seq_len"] // case["lm_head_chunk_size"] == 8
    assert all(" float32 " in s for s in log_probs)
    assert not any(" bfloat16 " in s and "2048]" in s for s in outside)  # no 16-bit [*, v]
    logits = [s for s in outside if s.startswith("_to_copy") and s.split("]")[0].endswith("2048")]
    assert sum(int(s.rsplit(" ", 1)[1]) for s in logits) == _held_logits_bytes(case)
