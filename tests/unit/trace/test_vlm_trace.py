"""Vision-language models (issue 29): the formulas against a measured step with images.

Tiny Qwen2.5-VL and Llama 3.2 Vision configs (2-4 layers of width 256, towers of width 128,
as tests/conformance_families.py shrinks the text families), one step with images traced on
real CPU tensors (trace/_vlm.py: the models read their image inputs' values, which the fake
CUDA device's fake tensors cannot give). Thresholds: parameters, gradients and optimizer
states within 1%, activations and peak allocated within 3% (the issue's Done-when).

Measured (amp-bf16, flash, no recompute, micro-batch 1, seq 128, one 224-pixel image): Qwen2.5-VL
activations -1.2% (estimate 205,808,384 B, trace 208,349,696 B), peak allocated -0.08%;
Llama 3.2 Vision activations -2.2% (147,051,776 / 150,296,064 B), peak allocated -0.05%;
parameters and gradients exact, optimizer states within 0.01%.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch", reason="trainmem[trace] not installed: pip install 'trainmem[trace]'")
pytest.importorskip("transformers", reason="trainmem[trace] not installed")

from trainmem.engine import estimate, make_grid, model_from_hf_config  # noqa: E402
from trainmem.trace._vlm import trace_vlm_step  # noqa: E402

QWEN25_VL_TINY: dict[str, Any] = {
    "model_type": "qwen2_5_vl",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
    "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]},
    "vision_config": {
        "depth": 2,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_heads": 2,
        "out_hidden_size": 256,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [1],
    },
}
MLLAMA_TINY: dict[str, Any] = {
    "model_type": "mllama",
    "text_config": {
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128256,
        "cross_attention_layers": [1, 3],
        "tie_word_embeddings": False,
    },
    "vision_config": {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_global_layers": 1,
        "attention_heads": 2,
        "image_size": 112,
        "patch_size": 14,
        "max_num_tiles": 4,
        "vision_output_dim": 384,
        "intermediate_layers_indices": [0, 1],
        "supported_aspect_ratios": [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]],
    },
}
JOB = {
    "micro_batch_size": 1,
    "seq_len": 128,
    "images_per_sample": 1,
    "image_size": 224,
    "precision": "amp-bf16",
    "recompute": "none",
}


@pytest.mark.parametrize("config", [QWEN25_VL_TINY, MLLAMA_TINY], ids=["qwen2.5-vl", "mllama"])
def test_vlm_step_estimate_equals_trace(config: dict[str, Any]) -> None:
    traced = trace_vlm_step(config, **JOB)
    m = model_from_hf_config(config, name="tiny")
    assert traced["num_parameters"] == m.num_parameters
    out = estimate(m, make_grid({**JOB, "attention": "flash"}))
    pairs = {
        "parameters": ("parameters_bytes", 0.01),
        "gradients_total": ("gradients_bytes", 0.01),
        "optimizer_states": ("optimizer_states_bytes", 0.01),
        "activations_total": ("activations_bytes", 0.03),
        "peak_allocated_bytes": ("peak_allocated_bytes", 0.03),
    }
    for ours, (theirs, tol) in pairs.items():
        assert float(out[ours][0]) == pytest.approx(traced[theirs], rel=tol), ours
