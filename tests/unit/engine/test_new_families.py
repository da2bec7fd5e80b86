"""OLMo 2, Granite, StableLM and Phi-1/2 (issue 14): read from config.json with their own layout.

The parameter counts are PyTorch's: sum(p.numel() for p in model.parameters()) of
transformers.AutoModelForCausalLM.from_config built on torch.device("meta") (torch 2.13.0+cpu,
transformers 5.x; tied embeddings counted once), for the presets (tests/golden checks them against
tests/data/param_counts.json) and for the variants below, which no preset covers. The tensor count
is len(list(model.parameters())) (fused AdamW keeps one `step` per tensor).
"""

from __future__ import annotations

import numpy as np
import pytest

from trainmem.catalog import load_model
from trainmem.engine import estimate, make_grid, model_from_hf_config

TINY = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "vocab_size": 1000,
}
VARIANTS = [
    # (config fields on top of TINY, PyTorch's parameter count, parameter tensors)
    # StableLM-2-12B's layout: per-head q/k LayerNorms, parallel residual (one norm), GQA
    (
        {"model_type": "stablelm", "num_key_value_heads": 2, "qk_layernorm": True,
         "use_parallel_residual": True, "use_qkv_bias": False},
        1_628_288,
        42,
    ),
    # StableLmConfig's default of 32 k/v heads applies when the field is absent
    ({"model_type": "stablelm", "qk_layernorm": True, "use_qkv_bias": True}, 2_618_880, 112),
    ({"model_type": "phi", "qk_layernorm": True, "num_key_value_heads": 4}, 1_435_368, 41),
    ({"model_type": "phi", "tie_word_embeddings": True}, 1_310_696, 32),
    ({"model_type": "olmo2", "num_key_value_heads": 2, "attention_bias": True}, 1_629_312, 33),
    (
        {"model_type": "granite", "num_key_value_heads": 2, "tie_word_embeddings": False,
         "mlp_bias": True},
        1_629_952,
        27,
    ),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "count", "tensors"), VARIANTS)
def test_variant_parameter_count_equals_pytorch(fields: dict, count: int, tensors: int) -> None:
    m = model_from_hf_config({**TINY, **fields}, name="x.json")
    assert (m.num_parameters, m.num_param_tensors) == (count, tensors)


def test_layouts() -> None:
    olmo = load_model("olmo-2-7b")
    assert (olmo.norm, olmo.qk_norm, olmo.qk_norm_layout) == ("olmo2_rms", True, "full")
    names = {p.name: p.shape for p in olmo.param_tensors()}
    assert names["q_norm.weight"] == (4096,) and "input_layernorm.weight" not in names
    assert "post_feedforward_layernorm.weight" in names
    granite = load_model("granite-3.1-8b")
    assert granite.logits_scaling == 16.0 and granite.tie_word_embeddings
    assert granite.attention_dropout == 0.1
    stablelm = load_model("stablelm-2-1.6b")
    assert (stablelm.norm, stablelm.gated_mlp, stablelm.attention_bias) == ("layernorm", True, True)
    assert not stablelm.o_proj_bias and not stablelm.parallel_residual
    assert (stablelm.rotary_dim, stablelm.num_norms_per_layer) == (16, 2)
    phi = load_model("phi-2")
    assert (phi.parallel_residual, phi.num_norms_per_layer, phi.rotary_dim) == (True, 1, 32)
    assert phi.lm_head_bias and phi.mlp_bias and phi.o_proj_bias and not phi.gated_mlp
    assert (phi.mlp_act, phi.dropout) == ("gelu_new", 0.1)


def test_bad_partial_rotary_factor_is_one_line() -> None:
    with pytest.raises(ValueError, match=r"partial_rotary_factor must be a number in \(0, 1\]"):
        model_from_hf_config({**TINY, "model_type": "phi", "partial_rotary_factor": 0}, name="x")


@pytest.mark.parametrize("name", ["olmo-2-7b", "granite-3.1-8b", "stablelm-2-1.6b", "phi-2"])
def test_estimate_runs(name: str) -> None:
    m = load_model(name)
    grid = make_grid(
        {
            "num_gpus": [8, 8, 8],
            "tp": [1, 1, 2],
            "recompute": ["none", "full", "selective"],
            "seq_len": [2048, 4096, 1024],
        }
    )
    out = estimate(m, grid)
    assert np.all(out["activations_total"] > 0)
    assert np.all(np.isfinite(out["peak_device_bytes"]))
