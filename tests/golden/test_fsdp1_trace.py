"""torch FSDP1 (FullyShardedDataParallel, as Lightning's FSDPStrategy runs LitGPT's full
fine-tune) against one rank's traced step: tests/data/framework_traces/fsdp1_llama.json
(make_fsdp1_traces.py: transformers' Llama, per-block units, world 4, bf16-true and mixed bf16,
with and without per-block checkpointing; cases D and E: gradient accumulation over 2
micro-batches, the first under FSDP1's no_sync as Lightning runs it, the measured step the
synchronising one).

The trace runs transformers' model, so the estimate is hf's blocks with FSDP1's terms: hf's
row of FSDP1_FULL_FINETUNE switched on (the framework's other decisions are hf's; the
activations' own accuracy is the hf cases' elsewhere). Tolerance 3% of peak allocated (the
project's target): the estimate is -1.5% / 0.0% / -2.0% (the FSDP2 model of the same blocks
is -1.4% / 0.0% / -1.8% against an FSDP2 trace of them, tests/data/framework_traces/
make_fsdp1_traces.py's docstring); with accumulation (D, E: the unsharded gradients held,
engine/_data_parallel.py unsharded_accumulated_gradient_bytes) +0.7% / +1.2%; the forward peak
within 0.1%.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.framework_accuracy import small_llama_spec
from trainmem.engine import FRAMEWORKS

TRACE = Path(__file__).parents[1] / "data" / "framework_traces" / "fsdp1_llama.json"
CASES = json.loads(TRACE.read_text())["cases"]
PEAK_TOLERANCE = 0.03
"""The project's target for a traced peak (ACCURACY.md); observed at most 2.0%."""
FORWARD_TOLERANCE = 0.001
"""The forward peak (the loss: the root unsharded, no block gathered) is exact to the 16-byte
rounding of small tensors."""


def _spec(config: dict):
    c = config
    return small_llama_spec(
        {
            "hidden": c["hidden_size"],
            "intermediate": c["intermediate_size"],
            "heads": c["num_attention_heads"],
            "kv_heads": c["num_key_value_heads"],
            "layers": c["num_hidden_layers"],
            "vocab": c["vocab_size"],
        }
    )


def _estimate(case: dict, monkeypatch, *, fsdp1: bool, attention: str = "flash") -> dict:
    """hf's estimate of a traced FSDP1 case, with hf's rows of FSDP1_FULL_FINETUNE and
    FSDP1_LORA set to `fsdp1` (tests/golden/test_llama_recipes_trace.py uses it too)."""
    import trainmem.engine._fast._scalar as scalar
    import trainmem.engine._rank_states as rank_states
    from trainmem.engine import estimate_one

    for name in ("FSDP1_FULL_FINETUNE", "FSDP1_LORA"):
        table = getattr(rank_states, name).copy()
        table[FRAMEWORKS.index("hf")] = fsdp1
        monkeypatch.setattr(rank_states, name, table)
    monkeypatch.setattr(scalar, "_caches", {})  # the per-model key tables, made afresh
    lora = {k: case[k] for k in ("lora_rank", "lora_targets") if k in case}
    return estimate_one(
        _spec(case["config"]),
        micro_batch_size=case["micro_batch_size"],
        seq_len=case["seq_len"],
        precision=case["precision"],
        recompute=case["recompute"],
        framework="hf",
        optimizer="adamw",
        num_gpus=case["num_gpus"],
        zero=3,
        attention=attention,
        global_batch_size=case["micro_batch_size"]
        * case["num_gpus"]
        * case.get("grad_accum_steps", 1),
        **lora,
    )


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_fsdp1_peak_within_tolerance(case, monkeypatch) -> None:
    got = _estimate(case, monkeypatch, fsdp1=True)
    assert got["peak_allocated_bytes"] == pytest.approx(
        case["peak_allocated_bytes"], rel=PEAK_TOLERANCE
    )
    assert got["peak_forward_bytes"] == pytest.approx(
        case["phases"]["forward"], rel=FORWARD_TOLERANCE
    )


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_fsdp1_states_exact(case, monkeypatch) -> None:
    got = _estimate(case, monkeypatch, fsdp1=True)
    for key in ("parameters", "optimizer_states"):  # `gradients` is the peak's, not the set's
        assert got[key] == case[f"{key}_bytes"], key


def test_the_trace_tells_fsdp1_from_fsdp2(monkeypatch) -> None:
    """With recompute, FSDP2's terms (a reduce-scatter input held, a block gathered at the
    loss) are more than 3% above the FSDP1 trace: the trace decides between them."""
    case = next(c for c in CASES if c["recompute"] == "full" and c["precision"] == "bf16")
    fsdp2 = _estimate(case, monkeypatch, fsdp1=False)
    assert fsdp2["peak_allocated_bytes"] > (1 + PEAK_TOLERANCE) * case["peak_allocated_bytes"]
    assert fsdp2["peak_forward_bytes"] > (1 + PEAK_TOLERANCE) * case["phases"]["forward"]


def test_accumulation_holds_the_unsharded_gradients(monkeypatch) -> None:
    """The synchronising micro-step's forward peak is the single-step case's plus the whole
    unsharded gradient (no_sync kept it from the micro-batch before): the trace says so, and
    the estimate adds exactly that."""
    one = next(c for c in CASES if c["case"] == "A")
    accumulated = next(c for c in CASES if c["case"] == "D")
    unsharded_bytes = 2 * accumulated["num_parameters"] * accumulated["num_gpus"]  # bf16, whole
    traced = accumulated["phases"]["forward"] - one["phases"]["forward"]
    assert traced == pytest.approx(unsharded_bytes, rel=1e-3)
    got = _estimate(accumulated, monkeypatch, fsdp1=True)["peak_forward_bytes"]
    base = _estimate(one, monkeypatch, fsdp1=True)["peak_forward_bytes"]
    assert got - base == pytest.approx(traced, rel=1e-3)
