"""The conformance matrix's tiny models: one small config.json per preset family (its preset with
a few overrides: 2-3 layers of width 256), for bench/conformance.py (the whole matrix) and
tests/unit/trace/test_conformance_quick.py (a few of its cells in CI), so that both trace and
estimate the same models."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

PRESETS = Path(__file__).resolve().parents[1] / "catalog" / "presets"

# Tiny versions of the preset families: (preset, overrides). Each keeps the family's structure.
_GQA = {"num_attention_heads": 4, "num_key_value_heads": 2}
FAMILIES: dict[str, tuple[str | None, dict[str, Any]]] = {
    "llama": (
        "llama-3.2-1b",
        {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "head_dim": 64}
        | _GQA,
    ),
    "qwen2.5": (  # q/k/v biases, tied embeddings
        "qwen2.5-0.5b",
        {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2} | _GQA,
    ),
    "qwen3": (  # qk-norm, head_dim != hidden / heads (as Qwen3-0.6B: 1024 / 16 heads of 128)
        None,
        {
            "model_type": "qwen3",
            "architectures": ["Qwen3ForCausalLM"],
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_hidden_layers": 2,
            "head_dim": 128,
            "vocab_size": 151936,
            "max_position_embeddings": 40960,
            "tie_word_embeddings": True,
            "attention_bias": False,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "use_sliding_window": False,
            "sliding_window": None,
        }
        | _GQA,
    ),
    "gemma": (  # head_dim 256, one kv head, gelu, scaled embeddings
        "gemma-2b",
        {
            "hidden_size": 256,
            "intermediate_size": 1024,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 256,
        },
    ),
    "mistral": (  # sliding window 128
        "mistral-7b",
        {
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_hidden_layers": 2,
            "sliding_window": 128,
        }
        | _GQA,
    ),
    "phi3": (  # fused qkv and gate_up, sliding window 2^k - 1 as Phi-3-mini's 2047
        "phi-3-mini",
        {
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "sliding_window": 127,
        },
    ),
    "gpt2": ("gpt2", {"n_embd": 256, "n_layer": 2, "n_head": 4}),
    "bert": (
        "bert-base-uncased",
        {
            "hidden_size": 256,
            "intermediate_size": 1024,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
        },
    ),
    "mixtral": (
        "mixtral-8x7b",
        {
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_hidden_layers": 2,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
        }
        | _GQA,
    ),
    "qwen3-moe": (
        "qwen3-30b-a3b",
        {
            "hidden_size": 256,
            "intermediate_size": 512,
            "moe_intermediate_size": 128,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "num_hidden_layers": 2,
            "max_window_layers": 2,
            "head_dim": 64,
        }
        | _GQA,
    ),
    "deepseek-v2": (  # MLA (no q low rank), one dense layer then MoE with shared experts
        "deepseek-v2-lite",
        {
            "hidden_size": 256,
            "intermediate_size": 512,
            "moe_intermediate_size": 128,
            "n_routed_experts": 8,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "first_k_dense_replace": 1,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "kv_lora_rank": 64,
            "qk_nope_head_dim": 32,
            "qk_rope_head_dim": 16,
            "v_head_dim": 32,
        },
    ),
    # Issue 14's families with readers of their own.
    "pythia": (  # GPT-NeoX: fused qkv with biases, parallel residual, rotary on a quarter
        "pythia-2.8b",
        {
            "hidden_size": 256,
            "intermediate_size": 1024,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
        },
    ),
    "falcon": (  # Falcon-7B: multi-query fused qkv, one LayerNorm feeding attention and MLP
        "falcon-7b",
        {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4},
    ),
    "falcon-40b": (  # new decoder architecture: k/v groups, ln_attn + ln_mlp
        "falcon-40b",
        {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8, "num_kv_heads": 2},
    ),
    "olmo2": (  # post-norm blocks, q/k RMSNorm over the whole projection, untied
        "olmo-2-7b",
        {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2} | _GQA,
    ),
    "granite": (  # Llama layout, muP multipliers, logits / logits_scaling, attention dropout
        "granite-3.1-8b",
        {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2} | _GQA,
    ),
    "stablelm": (  # LayerNorm with bias, q/k/v biases, rotary on a quarter of each head
        "stablelm-2-1.6b",
        {
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
        },
    ),
    "phi2": (  # parallel attention + GeLU MLP off one LayerNorm, biases, partial rotary 0.4,
        # resid_pdrop 0.1; 8 heads of 32 keep an even rotated width (12)
        "phi-2",
        {
            "hidden_size": 256,
            "intermediate_size": 1024,
            "num_hidden_layers": 2,
            "num_attention_heads": 8,
            "num_key_value_heads": 8,
        },
    ),
    "gemma2": (  # sandwich norms, attention and final logit soft-capping, alternating 128-token
        # windows, GQA; transformers runs it eager only (no SDPA for Gemma2)
        "gemma-2-2b",
        {
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_hidden_layers": 2,
            "head_dim": 128,
            "sliding_window": 128,
        }
        | _GQA,
    ),
    "gemma3": (  # sandwich norms, q/k norms over head_dim, two sliding-window (128) layers and
        # one global (5:1 in the presets), two rope tables; SDPA and eager
        "gemma-3-1b",
        {
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_hidden_layers": 3,
            "head_dim": 256,
            "sliding_window": 128,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        }
        | _GQA,
    ),
}


def family_config(family: str) -> dict[str, Any]:
    """The tiny config.json dict of a family (its preset with the overrides)."""
    preset, overrides = FAMILIES[family]
    base: dict[str, Any] = {}
    if preset:
        base = json.loads((PRESETS / f"{preset}.json").read_text())
    base = {k: v for k, v in base.items() if not k.startswith("_")}
    return {**base, **copy.deepcopy(overrides)}
