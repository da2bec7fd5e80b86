"""Architectures beyond Llama-style decoders (issue 14): GPT-NeoX / Pythia, Falcon, Gemma 2 and 3
(more on Gemma 3 in test_gemma3.py).

Each config in tests/data/configs is a copy of the public Hugging Face config.json (values typed
without network access, checked against transformers' config class defaults). Its parameter count
must equal PyTorch's; an unknown model_type must be a one-line error, never a guessed layout.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainmem.catalog import load_model
from trainmem.cli import main
from trainmem.engine import estimate, make_grid, model_from_hf_config

CONFIGS = Path(__file__).parents[2] / "data" / "configs"

PYTORCH_COUNTS = {
    "pythia-160m": 162_322_944,
    "pythia-2.8b": 2_775_208_960,
    "falcon-7b": 6_921_720_704,
    "falcon-40b": 41_303_293_952,
    "gemma-2-2b": 2_614_341_888,
    "gemma-2-9b": 9_241_705_984,
    "gemma-3-1b": 999_885_952,
}
"""sum(p.numel() for p in model.parameters()) of transformers.AutoModelForCausalLM.from_config
built on torch.device("meta") from each tests/data/configs/<name>/config.json (torch 2.13.0+cpu,
transformers 5.24.0; tied embeddings counted once)."""

VARIANT_COUNTS = {
    "pythia-160m": [
        # use_parallel_residual false, tied embeddings, no attention biases, 2 layers.
        (
            {
                "use_parallel_residual": False,
                "tie_word_embeddings": True,
                "attention_bias": False,
                "num_hidden_layers": 2,
            },
            52_804_608,
        ),
        ({"rotary_pct": 1.0, "num_hidden_layers": 2}, 91_444_224),
    ],
    "falcon-7b": [
        ({"parallel_attn": False, "num_hidden_layers": 2}, 709_636_480),  # two LayerNorms
        (
            {
                "multi_query": False,
                "bias": True,
                "tie_word_embeddings": False,
                "num_hidden_layers": 2,
            },
            1_086_597_632,
        ),
        ({"alibi": True, "ffn_hidden_size": 1000, "num_hidden_layers": 2}, 397_427_328),
        ({"num_ln_in_parallel_attn": 2, "num_hidden_layers": 2}, 709_636_480),
    ],
    "falcon-40b": [({"num_ln_in_parallel_attn": 1, "num_hidden_layers": 2}, 1_891_680_256)],
    "gemma-2-2b": [({"tie_word_embeddings": False, "num_hidden_layers": 2}, 1_335_382_272)],
}
"""Variants of the configs above, counted the same way (same torch and transformers)."""


def _config(name: str) -> dict:
    return json.loads((CONFIGS / name / "config.json").read_text())


@pytest.mark.parametrize("name", sorted(PYTORCH_COUNTS))
def test_parameter_count_equals_pytorch(name: str) -> None:
    m = load_model(str(CONFIGS / name))
    assert m.num_parameters == PYTORCH_COUNTS[name]
    assert m.family == "decoder"


@pytest.mark.parametrize(
    ("name", "change", "count"),
    [(name, change, count) for name, cases in VARIANT_COUNTS.items() for change, count in cases],
)
def test_variant_parameter_count_equals_pytorch(name: str, change: dict, count: int) -> None:
    m = model_from_hf_config({**_config(name), **change}, name=name)
    assert m.num_parameters == count


def test_layouts() -> None:
    neox = load_model(str(CONFIGS / "pythia-2.8b"))
    assert (neox.parallel_residual, neox.partial_rotary_factor, neox.tie_word_embeddings) == (
        True,
        0.25,
        False,
    )
    assert neox.norm == "layernorm" and not neox.gated_mlp and neox.fused_qkv
    falcon7 = load_model(str(CONFIGS / "falcon-7b"))
    assert (falcon7.num_key_value_heads, falcon7.num_norms_per_layer) == (1, 1)
    assert falcon7.tie_word_embeddings and not falcon7.mlp_bias
    falcon40 = load_model(str(CONFIGS / "falcon-40b"))
    assert (falcon40.num_key_value_heads, falcon40.num_norms_per_layer) == (8, 2)
    gemma2 = load_model(str(CONFIGS / "gemma-2-9b"))
    assert gemma2.num_norms_per_layer == 4 and gemma2.tie_word_embeddings
    assert (gemma2.attn_logit_softcapping, gemma2.final_logit_softcapping) == (50.0, 30.0)
    assert (gemma2.alternating_sliding_window, gemma2.sliding_window) == (4096, 0)


@pytest.mark.parametrize("model_type", ["olmo", "gptj", "gpt_bigcode", "Mamba", None])
def test_unknown_model_type_is_a_one_line_error(model_type: str | None) -> None:
    config = {k: v for k, v in _config("pythia-160m").items() if k != "model_type"}
    if model_type is not None:
        config["model_type"] = model_type
    with pytest.raises(ValueError) as err:
        model_from_hf_config(config, name="x.json")
    text = str(err.value)
    assert "\n" not in text
    assert (repr(model_type) if model_type else "model_type is missing") in text
    for known in ("llama", "gpt_neox", "falcon", "gemma2", "gemma3_text", "gpt2", "bert"):
        assert known in text


def test_unknown_model_type_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**_config("pythia-160m"), "model_type": "olmo"}))
    capsys.readouterr()
    assert main(["estimate", "--model", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "olmo" in lines[0]


@pytest.mark.parametrize("name", sorted(PYTORCH_COUNTS))
def test_estimate_runs(name: str) -> None:
    m = load_model(str(CONFIGS / name))
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
    assert np.all(out["activations_per_layer"] > 0)
    assert np.all(np.isfinite(out["peak_device_bytes"]))
    assert np.all(out["peak_device_bytes"] > 0)
