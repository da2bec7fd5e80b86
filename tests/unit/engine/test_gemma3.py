"""Gemma 3 (issue 14): config.json -> spec, parameter counts against PyTorch, and activations
against the project's own trace.

The traced figures are `bench/conformance.py` cells of the tiny family "gemma3"
(tests/conformance_families.py: 3 layers of hidden 256, 4 query / 2 k/v heads of 256, layers
sliding (128), sliding, global; vocabulary 262,144), traced on the fake CUDA device (torch 2.13,
transformers 5.24). Tolerance 0.2% of the per-layer bytes: the formulas leave out the six
(1 + weight) fp32 vectors of a block's Gemma3RMSNorms (6 KiB per layer here); totals and peaks
agree within 0.02%.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conformance_families import family_config
from trainmem.catalog import load_model
from trainmem.engine import estimate, make_grid, model_from_hf_config

CONFIGS = Path(__file__).parents[2] / "data" / "configs"

PYTORCH_COUNTS = {
    "gemma-3-1b": 999_885_952,
    "gemma-3-4b": 4_300_079_472,
}
"""sum(p.numel() for p in model.parameters()) on torch.device("meta") (torch 2.13.0+cpu,
transformers 5.24.0): Gemma3ForCausalLM for gemma-3-1b; Gemma3ForConditionalGeneration for the
multimodal gemma-3-4b config.json (which AutoModelForCausalLM builds too): its language model,
3,880,263,168 (the text-only gemma-3-4b preset), its SigLIP tower, 416,866,032, and projector,
2,950,272."""
GEMMA3_4B_TOWER_AND_PROJECTOR = 416_866_032 + 2_950_272

VARIANT_COUNTS: list[tuple[dict[str, Any], int]] = [
    ({"tie_word_embeddings": False, "num_hidden_layers": 2}, 657_665_152),
    ({"num_hidden_layers": 7, "sliding_window_pattern": 2}, 489_885_824),
    (
        {"num_hidden_layers": 3, "layer_types": ["full_attention"] * 3, "attention_bias": True},
        382_525_440,
    ),
]
"""Variants of gemma-3-1b's config.json, counted by Gemma3ForCausalLM the same way."""

# (precision, attention, recompute, seq_len, micro-batch) -> traced bytes: activations,
# per layer, outside the layers, peak allocated
TRACED: list[tuple[tuple[str, str, str, int, int], tuple[int, int, int, int]]] = [
    # at the window: both sliding layers take SDPA's mask (repeated k/v, efficient kernel)
    (("bf16", "flash", "none", 128, 1), (147_634_176, 4_274_176, 134_811_648, 839_987_712)),
    # above it in fp32: masked sliding layers, the global one on SDPA's math fallback
    (("fp32", "flash", "none", 256, 1), (308_084_224, 12_602_709, 270_276_096, 1_692_789_248)),
    # checkpointed eager blocks keep both additive masks (sliding and causal)
    (("amp-bf16", "eager", "full", 256, 2), (676_079_616, 524_288, 540_289_024, 2_597_656_064)),
]


def _config(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / name / "config.json").read_text())


@pytest.mark.parametrize("name", sorted(PYTORCH_COUNTS))
def test_parameter_count_equals_pytorch(name: str) -> None:
    assert load_model(str(CONFIGS / name)).num_parameters == PYTORCH_COUNTS[name]


@pytest.mark.parametrize(("change", "count"), VARIANT_COUNTS)
def test_variant_parameter_count_equals_pytorch(change: dict[str, Any], count: int) -> None:
    m = model_from_hf_config({**_config("gemma-3-1b"), **change}, name="gemma-3-1b")
    assert m.num_parameters == count


def test_reader_fields() -> None:
    m = load_model(str(CONFIGS / "gemma-3-1b"))
    assert (m.family, m.model_type, m.norm, m.num_norms_per_layer) == (
        "decoder",
        "gemma3_text",
        "gemma_rms",
        4,
    )
    assert m.qk_norm and m.qk_norm_layout == "head" and m.embed_scale and m.tie_word_embeddings
    assert (m.num_key_value_heads, m.head_dim, m.query_pre_attn_scalar) == (1, 256, 256.0)
    # 26 layers, every 6th global; two rope tables; no soft-capping (null in the config)
    assert (m.alternating_sliding_window, m.num_sliding_layers, m.sliding_window) == (512, 22, 0)
    assert m.num_rotary_tables == 2
    assert (m.attn_logit_softcapping, m.final_logit_softcapping) == (0.0, 0.0)


def test_multimodal_config_reads_the_text_config_with_its_defaults_and_the_tower() -> None:
    m = load_model(str(CONFIGS / "gemma-3-4b"))
    preset = load_model("gemma-3-4b")
    assert m.model_type == "gemma3"
    # heads, head_dim and vocabulary are Gemma3TextConfig's defaults (absent from text_config)
    assert (m.num_attention_heads, m.num_key_value_heads, m.head_dim) == (8, 4, 256)
    assert (m.vocab_size, m.num_sliding_layers, m.alternating_sliding_window) == (262_208, 29, 1024)
    assert m.num_parameters == preset.num_parameters + GEMMA3_4B_TOWER_AND_PROJECTOR
    assert m.vision is not None and m.vision.kind == "gemma3"
    assert (m.vision.num_layers, m.vision.hidden_size, m.vision.image_tokens) == (27, 1152, 256)


def test_attention_softcapping_is_ignored_as_transformers_does() -> None:
    # Gemma3Attention never passes attn_logit_softcapping to the kernel; the final one applies.
    config = {**_config("gemma-3-1b"), "attn_logit_softcapping": 50.0}
    m = model_from_hf_config({**config, "final_logit_softcapping": 30.0}, name="x")
    assert (m.attn_logit_softcapping, m.final_logit_softcapping) == (0.0, 30.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layer_types": ["sliding_attention"]}, "layer_types"),
        ({"layer_types": ["local"] * 26}, "layer_types"),
        ({"sliding_window_pattern": 0}, "sliding_window_pattern"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ],
)
def test_bad_fields_are_one_line_errors(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        model_from_hf_config({**_config("gemma-3-1b"), **change}, name="x.json")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("flags", "traced"), TRACED)
def test_activations_agree_with_the_trace(flags: tuple, traced: tuple) -> None:
    precision, attention, recompute, seq_len, micro_batch = flags
    m = model_from_hf_config(family_config("gemma3"), name="tiny-gemma3")
    grid = make_grid(
        seq_len=seq_len,
        precision=precision,
        attention=attention,
        recompute=recompute,
        micro_batch_size=micro_batch,
    )
    out = {k: float(np.asarray(v)[0]) for k, v in estimate(m, grid).items() if k != "reason"}
    activations, per_layer, outside, peak = traced
    assert out["activations_per_layer"] == pytest.approx(per_layer, rel=2e-3)
    assert out["activations_outside_layers"] == pytest.approx(outside, rel=2e-5)
    assert out["activations_total"] == pytest.approx(activations, rel=2e-4)
    assert out["peak_allocated_bytes"] == pytest.approx(peak, rel=2e-4)


def test_sliding_layers_change_sdpa_bytes_from_the_window_on() -> None:
    m = model_from_hf_config(family_config("gemma3"), name="tiny-gemma3")
    per_token = []
    for s in (64, 127, 128, 256):
        grid = make_grid(seq_len=s, precision="bf16", attention="flash")
        per_token.append(float(estimate(m, grid)["activations_per_layer"][0]) / s)
    below, just_below, at, above = per_token
    assert below == pytest.approx(just_below, rel=1e-3)
    assert at > just_below and above > at  # the mask grows with s once it exists
