"""A vision-language model's memory beyond its language model's: the image tokens in the
language model's sequence, the tower's parameters when frozen, the tower's blocks as a
transformer the activation formulas know (tower_spec), and Mllama's cross-attention keys.

The tower's saved activations are the engine's block formulas run on tower_spec with the
tower's sequence (_rank_activations.vision_saved_bytes); this module holds what is particular to
the VLMs. Every function is vectorized over rows.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ._model import ModelSpec
from ._vision import (
    VisionGroup,
    VisionSpec,
    cross_attention_keys_per_image,
    image_tokens_per_image,
    vision_sequence_per_image,
)

VISION_GROUPS: tuple[VisionGroup, ...] = ("vision", "vision_block", "vision_global")


def language_seq_len(m: ModelSpec, c: dict[str, np.ndarray]) -> np.ndarray:
    """The language model's sequence: seq_len text tokens plus images_per_sample x the tokens
    of one image (Qwen2-VL / 2.5-VL: (h/28)(w/28) after smart_resize; Mllama: none, the images
    reach the text through cross-attention).

    Source: _vision.image_tokens_per_image (processing_qwen2_vl.py, transformers 5.24.0).
    Assumes: every image of a sample has the same size (`image_size` square pixels).
    """
    s = c["seq_len"].astype(np.float64)
    if m.vision is None:
        return s
    images = c["images_per_sample"].astype(np.float64)
    return s + images * image_tokens_per_image(m.vision, c["image_size"])


def vision_trainable(m: ModelSpec, c: dict[str, np.ndarray]) -> np.ndarray:
    """Rows whose tower and projector train: not frozen (freeze_vision) and not LoRA (PEFT's
    get_peft_model freezes every parameter it does not adapt; the tower's are not adapted)."""
    frozen = np.asarray(c.get("freeze_vision", False), dtype=bool)
    lora = np.asarray(c.get("lora_rank", 0)) > 0
    if m.vision is None:
        return np.zeros_like(frozen | lora)
    return ~frozen & ~lora


def vision_group_counts(
    m: ModelSpec, c: dict[str, np.ndarray], first: np.ndarray, ones: np.ndarray
) -> dict[str, np.ndarray]:
    """Occurrences of the tower's groups among the rank's trainable-or-held tensors: on the
    first stage, none where freeze_vision (a frozen tower's weights are added as parameters
    only: frozen_vision_parameter_numel)."""
    assert m.vision is not None
    frozen = np.asarray(c.get("freeze_vision", False), dtype=bool)
    return {
        group: np.where(first & ~frozen, float(m.group_count(group)), 0.0) * ones
        for group in VISION_GROUPS
    }


def frozen_vision_parameter_numel(m: ModelSpec) -> int:
    """Elements of the tower and projector (all of them, every block)."""
    return sum(
        p.numel * m.group_count(p.group) for p in m.param_tensors() if p.group in VISION_GROUPS
    )


@lru_cache(maxsize=64)
def tower_spec(v: VisionSpec) -> ModelSpec:
    """The tower's blocks as a ModelSpec the block formulas read: Qwen2-VL (LayerNorm, fused
    qkv with bias, GELU fc1/fc2 with biases, 2-D rotary), Qwen2.5-VL (RMSNorm, fused qkv, a gated
    SiLU MLP with biases, 2-D rotary), Mllama (LayerNorm, q/k/v/o without bias, GELU fc1/fc2
    with biases, no rotary: learned positions added once). Attention is bidirectional over an
    image; the formulas' flash path saves the same tensors for a causal and a full mask.
    Source: transformers 5.24.0 modeling_qwen2_vl.py, modeling_qwen2_5_vl.py, modeling_mllama.py.
    Ignores: the Qwen2.5-VL window attention's reordering of the patches (window_index: an
    index_select copy of the [patches, d] input, one tensor per image) and Mllama's gated global
    blocks' two scalar gates (their products are saved like a residual add)."""
    qwen = v.kind in ("qwen2_vl", "qwen2_5_vl")
    return ModelSpec(
        name=f"{v.kind}-vision-tower",
        family="decoder",
        model_type=f"{v.kind}_vision",
        hidden_size=v.hidden_size,
        intermediate_size=v.intermediate_size,
        num_hidden_layers=v.num_layers + v.num_global_layers,
        num_attention_heads=v.num_heads,
        num_key_value_heads=v.num_heads,
        head_dim=v.head_dim,
        vocab_size=1,
        max_position_embeddings=1,
        tie_word_embeddings=True,
        mlp_act="silu" if v.kind == "qwen2_5_vl" else "gelu",
        gated_mlp=v.kind == "qwen2_5_vl",
        norm="rms" if v.kind == "qwen2_5_vl" else "layernorm",
        attention_bias=qwen,
        o_proj_bias=qwen,
        mlp_bias=True,
        rotary=qwen,
        fused_qkv=qwen,
        fused_gate_up=False,
    )


def tower_sequence(m: ModelSpec, c: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(images in the micro-batch, positions per image in the tower's blocks): Qwen runs all
    the micro-batch's patches as one sequence [sum of patches, d] with per-image attention
    (cu_seqlens), Mllama each tile of each image (padded to 4 tiles of 1608)."""
    assert m.vision is not None
    images = c["micro_batch_size"].astype(np.float64) * c["images_per_sample"]
    return images, vision_sequence_per_image(m.vision, c["image_size"])


def projector_saved_bytes(m: ModelSpec, c: dict[str, np.ndarray], *, e) -> np.ndarray:
    """Bytes the merger / projector saves for backward where the tower trains: Qwen's PatchMerger
    keeps ln_q's output, the GELU's input and the second Linear's input, each [patches / 4, 4d]
    (3 [patches, d]); Mllama's projector its input, [keys, vision_output_dim].
    Source: modeling_qwen2_vl.py PatchMerger, modeling_mllama.py multi_modal_projector.
    Ignores: ln_q's own saved statistics and the RMSNorm's fp32 copy."""
    assert m.vision is not None
    v = m.vision
    images, per_image = tower_sequence(m, c)
    if v.kind == "mllama":
        return images * cross_attention_keys_per_image(v) * v.vision_output_dim * e
    return 3.0 * images * per_image * v.hidden_size * e


def cross_attention_saved_bytes(
    m: ModelSpec, c: dict[str, np.ndarray], *, e, layers_saving: np.ndarray
) -> np.ndarray:
    """Mllama: what the language model's cross-attention blocks save beyond a self-attention
    block's (whose formulas count them): per block k_proj's output (k_norm's input), k_norm's
    output and v, each [keys, kv_dim], over the image keys (tiles x 1601 per image), in
    `layers_saving` of them (0 where checkpointed); and the projector's output
    [keys, hidden], which every block reads (saved once, as each block's k_proj / v_proj input).
    Source: modeling_mllama.py MllamaTextCrossAttention (k_norm after k_proj, SDPA/flash saves
    q, k, v, out, lse).
    Ignores: the cross_attention_mask [b, 1, s, keys] (one bf16 tensor per step, kept by the
    model), the text-sized k and v the self-attention formula counts in these blocks."""
    if m.vision is None or not m.num_cross_attention_layers:
        return np.zeros_like(c["seq_len"], dtype=np.float64)
    keys = (
        c["micro_batch_size"].astype(np.float64)
        * c["images_per_sample"]
        * cross_attention_keys_per_image(m.vision)
    )
    per_block = 3.0 * keys * m.kv_dim * e
    return per_block * layers_saving + keys * m.hidden_size * e
