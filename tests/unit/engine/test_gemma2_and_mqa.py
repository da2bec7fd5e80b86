"""Gemma 2's activation terms, eager multi-query attention and Falcon's eager attention, against
the project's own trace
(`trainmem trace --attention eager --json`, fake CUDA device, torch 2.13, transformers 5.24,
2026-12-01) of 2-layer models built from the presets with hidden 256, 2 heads of 128, one k/v
head and a 256,000-token vocabulary (issue 14).

Tolerance 1% of the per-layer bytes: the trace rounds each storage to 512 bytes, the formulas
do not (eight [T, 1] fp32 tensors per layer: 128 bytes each at 32 tokens, 512 in the trace, and
the norms' (1 + weight) vectors): -0.8% at 32 tokens, -0.2% at 128. Totals agree within 0.02%.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from trainmem.catalog import model_config_dict
from trainmem.engine import estimate, make_grid, model_from_hf_config

TINY = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 128,
    "vocab_size": 256000,
}
# (preset, overrides, precision, seq_len) -> traced bytes: activations, per layer, outside, peak
TRACED: list[tuple[str, dict[str, Any], str, int, tuple[int, int, int, int]]] = [
    ("gemma-2-2b", {"sliding_window": 64}, "bf16", 128,
     (201_342_976, 2_168_832, 197_005_312, 863_795_712)),
    ("gemma-2-2b", {"sliding_window": 64}, "fp32", 32,
     (67_091_456, 710_656, 65_670_144, 1_591_778_304)),
    ("gemma-2-2b", {"sliding_window": 64, "attn_logit_softcapping": None,
                    "final_logit_softcapping": None}, "bf16", 128,
     (135_675_904, 2_103_296, 131_469_312, 798_128_640)),
    ("llama-3.2-1b", {"tie_word_embeddings": True}, "bf16", 128,
     (134_288_384, 1_442_816, 131_402_752, 796_734_464)),
    ("gemma-2b", {}, "bf16", 128, (134_621_184, 1_575_936, 131_469_312, 797_067_776)),
]  # fmt: skip
FALCON_7B_TINY = {  # tests/conformance_families.py "falcon": multi-query, parallel attention
    "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 65024,
}  # fmt: skip


def test_falcon_eager_attention_agrees_with_the_trace() -> None:
    # Falcon's own eager path: probabilities in the hidden dtype only, a one-head k broadcast
    # by the matmul (no repeat), k and v copied out of the fused output (which is not kept).
    config = {**model_config_dict("falcon-7b"), **FALCON_7B_TINY}
    m = model_from_hf_config(config, name="tiny-falcon")
    grid = make_grid(seq_len=128, precision="bf16", attention="eager")
    out = estimate(m, grid)
    assert out["activations_per_layer"][0] == pytest.approx(952_320, rel=2e-3)  # traced


@pytest.mark.parametrize(("preset", "overrides", "precision", "seq_len", "traced"), TRACED)
def test_eager_layers_agree_with_the_trace(
    preset: str, overrides: dict, precision: str, seq_len: int, traced: tuple
) -> None:
    config = {**model_config_dict(preset), **TINY, **overrides}
    m = model_from_hf_config(config, name=f"tiny-{preset}")
    grid = make_grid(seq_len=seq_len, precision=precision, attention="eager")
    out = {k: float(np.asarray(v)[0]) for k, v in estimate(m, grid).items() if k != "reason"}
    activations, per_layer, outside, peak = traced
    assert out["activations_per_layer"] == pytest.approx(per_layer, rel=1e-2)
    assert out["activations_outside_layers"] == pytest.approx(outside, rel=2e-5)
    assert out["activations_total"] == pytest.approx(activations, rel=2e-4)
    assert out["peak_allocated_bytes"] == pytest.approx(peak, rel=2e-4)


def test_soft_capping_adds_one_tanh_output_per_layer_and_one_for_the_logits() -> None:
    base = {**model_config_dict("gemma-2-2b"), **TINY, "sliding_window": 64}
    capped = model_from_hf_config(base, name="capped")
    plain = model_from_hf_config(
        {**base, "attn_logit_softcapping": None, "final_logit_softcapping": None}, name="plain"
    )
    grid = make_grid(seq_len=128, precision="bf16", attention="eager")
    a, b = estimate(capped, grid), estimate(plain, grid)
    # [b, a, s, s] bf16 scores per layer; [T, v] bf16 logits once
    assert a["activations_per_layer"][0] - b["activations_per_layer"][0] == 2 * 2 * 128 * 128
    assert a["activations_outside_layers"][0] - b["activations_outside_layers"][0] == (
        2 * 128 * 256_000
    )
