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

from ._model import MlpAct, ModelSpec
from ._precision import AUTOCAST_COPY_BYTES
from ._vision import (
    VisionGroup,
    VisionSpec,
    cross_attention_keys_per_image,
    image_tokens_per_image,
    unused_vision_block_numel,
    vision_param_tensors,
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


def image_block_masked(m: ModelSpec, c: dict[str, np.ndarray]) -> np.ndarray:
    """Rows whose every language-model layer takes an explicit attention mask because of the
    images: Gemma 3 with images, whose processor returns token_type_ids (return_mm_token_type_ids)
    and whose model then lets each image's tokens attend to each other both ways (a
    [b, 1, s, s] bool mask per layer type, OR-ed with the causal and sliding ones).
    Source: transformers 5.24.0 processing_gemma3.py, modeling_gemma3.py
    (create_masks_for_vision_model, get_block_sequence_ids_for_mask).
    Assumes: the batch carries the processor's token_type_ids (TRL and HF Trainer pass them)."""
    images = np.asarray(c.get("images_per_sample", 0)) > 0
    if m.vision is None or m.vision.kind != "gemma3":
        return np.zeros_like(images)
    return images


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
    used = {"vision_block": m.group_count("vision_block") - m.vision.num_unused_layers}
    return {
        group: np.where(first & ~frozen, float(used.get(group, m.group_count(group))), 0.0) * ones
        for group in VISION_GROUPS
    }


def frozen_vision_parameter_numel(m: ModelSpec) -> int:
    """Elements of the tower and projector (all of them, every block)."""
    return sum(
        p.numel * m.group_count(p.group) for p in m.param_tensors() if p.group in VISION_GROUPS
    )


def held_vision_parameter_numel(m: ModelSpec, frozen: np.ndarray) -> np.ndarray:
    """Elements of the tower held as weights only, outside the rank's trainable inventory
    (vision_group_counts): all of it where frozen (freeze_vision), else LLaVA's blocks after
    its feature layer, which no gradient reaches (_vision.unused_vision_block_numel).
    Ignores: CLIP's post_layernorm under LLaVA and SigLIP's pooling head (vision_use_head), also
    outside every gradient's path but counted as trainable (2 d and ~13 d^2 elements)."""
    assert m.vision is not None
    return np.where(
        frozen,
        float(frozen_vision_parameter_numel(m)),
        float(unused_vision_block_numel(m.vision)),
    )


def _tower_mlp_act(v: VisionSpec) -> MlpAct:
    """The tower MLP's activation: Qwen2.5-VL's SiLU, CLIP's quick_gelu (hidden_act, read only
    for LLaVA's and Gemma 3's towers), GELU for the others."""
    if v.kind == "qwen2_5_vl":
        return "silu"
    return "quick_gelu" if v.hidden_act == "quick_gelu" else "gelu"


@lru_cache(maxsize=64)
def tower_spec(v: VisionSpec) -> ModelSpec:
    """The tower's blocks as a ModelSpec the block formulas read: Qwen2-VL (LayerNorm, fused
    qkv with bias, GELU fc1/fc2 with biases, 2-D rotary), Qwen2.5-VL (RMSNorm, fused qkv, a gated
    SiLU MLP with biases, 2-D rotary), Mllama (LayerNorm, q/k/v/o without bias, GELU fc1/fc2
    with biases, no rotary: learned positions added once), LLaVA's CLIP and Gemma 3's SigLIP
    (LayerNorm, q/k/v/out_proj with biases, fc1/fc2 with biases and CLIP's quick_gelu or
    SigLIP's tanh GELU, learned positions; LLaVA's blocks after its feature layer save nothing
    by the backward: no loss reads them, their tensors go with the model's outputs). Attention
    is bidirectional over an image; the formulas' flash path saves the same tensors for a
    causal and a full mask.
    Source: transformers 5.24.0 modeling_qwen2_vl.py, modeling_qwen2_5_vl.py, modeling_mllama.py,
    modeling_clip.py, modeling_siglip.py.
    Ignores: the Qwen2.5-VL window attention's reordering of the patches (window_index: an
    index_select copy of the [patches, d] input, one tensor per image) and Mllama's gated global
    blocks' two scalar gates (their products are saved like a residual add)."""
    qwen = v.kind in ("qwen2_vl", "qwen2_5_vl")
    vit = v.kind in ("llava", "gemma3")
    return ModelSpec(
        name=f"{v.kind}-vision-tower",
        family="decoder",
        model_type=f"{v.kind}_vision",
        hidden_size=v.hidden_size,
        intermediate_size=v.intermediate_size,
        num_hidden_layers=v.num_layers - v.num_unused_layers + v.num_global_layers,
        num_attention_heads=v.num_heads,
        num_key_value_heads=v.num_heads,
        head_dim=v.head_dim,
        vocab_size=1,
        max_position_embeddings=1,
        tie_word_embeddings=True,
        mlp_act=_tower_mlp_act(v),
        gated_mlp=v.kind == "qwen2_5_vl",
        norm="rms" if v.kind == "qwen2_5_vl" else "layernorm",
        attention_bias=qwen or vit,
        o_proj_bias=qwen or vit,
        mlp_bias=True,
        rotary=qwen,
        fused_qkv=qwen,
        fused_gate_up=False,
    )


def tower_frozen_casts(m: ModelSpec) -> float:
    """The 16-bit casts of a block's two norm outputs its linears take under autocast, which a
    frozen base under LoRA no longer saves (lora_activation_delta_bytes `frozen_casts`): a
    tower_spec's as its full fine-tune's block counts them (hf_layer_bytes: one for a fused qkv
    or three; one up projection, or gate and up), a language model's 3 + 2.
    Source: hf_layer_bytes; traced: tests/unit/trace/test_vlm_trace.py (LoRA cases)."""
    if not m.model_type.endswith("_vision"):  # a language model (tower_spec names its towers)
        return 3.0 + 2.0
    qkv = 1.0 if m.fused_qkv else 3.0
    return qkv + (2.0 if m.gated_mlp and not m.fused_gate_up else 1.0)


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
    (3 [patches, d]); Mllama's projector its input, [keys, vision_output_dim]; LLaVA's and
    Gemma 3's (llava_projector_saved_bytes, gemma3_projector_saved_bytes).
    Source: modeling_qwen2_vl.py PatchMerger, modeling_mllama.py multi_modal_projector.
    Ignores: ln_q's own saved statistics and the RMSNorm's fp32 copy."""
    assert m.vision is not None
    v = m.vision
    images, per_image = tower_sequence(m, c)
    if v.kind == "mllama":
        return images * cross_attention_keys_per_image(v) * v.vision_output_dim * e
    if v.kind == "llava":
        return llava_projector_saved_bytes(v, images=images, per_image=per_image, e=e)
    if v.kind == "gemma3":
        return gemma3_projector_saved_bytes(v, images=images, per_image=per_image, e=e)
    return 3.0 * images * per_image * v.hidden_size * e


def llava_projector_saved_bytes(v: VisionSpec, *, images, per_image, e) -> np.ndarray:
    """LlavaMultiModalProjector's saved tensors: linear_1's input (one feature layer: a view of
    that hidden state [positions, d], class token included, which the view keeps whole; several:
    their concatenation [tokens, d x layers]), GELU's input and linear_2's input, each [tokens,
    text hidden].
    Source: transformers 5.24.0 modeling_llava.py get_image_features (hidden_states[k][:, 1:]
    under "default"), LlavaMultiModalProjector.forward."""
    tokens = float(v.image_tokens)
    layers = v.vision_output_dim // v.hidden_size
    first = np.where(layers == 1, per_image * v.hidden_size, tokens * v.vision_output_dim)
    return images * (first + 2.0 * tokens * v.out_hidden_size) * e


def gemma3_projector_saved_bytes(v: VisionSpec, *, images, per_image, e) -> np.ndarray:
    """Gemma3MultiModalProjector's saved tensors: AvgPool2d's input (the tower's output made
    contiguous as [d, side, side], per_image x d), and on the pooled [tokens, d]: the
    mm_soft_emb_norm's fp32 input and fp32 normalised product (Gemma3RMSNorm computes in fp32)
    and the matmul's input in the tower's dtype.
    Source: transformers 5.24.0 modeling_gemma3.py Gemma3MultiModalProjector.forward,
    Gemma3RMSNorm.
    Ignores: the norm's [tokens, 1] reciprocal."""
    tokens = float(v.image_tokens)
    return images * (per_image * v.hidden_size * e + tokens * v.hidden_size * (8.0 + e))


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


def _autocast_cast(name: str, shape: tuple[int, ...]) -> bool:
    """Whether autocast casts (and caches) this tower tensor for a matmul or a convolution: the
    linears' weights, the patch embedding's Conv2d / Conv3d weight and Gemma 3's projection
    matrix; not the positional, class or tile embeddings (added, or looked up)."""
    return len(shape) >= 2 and ("patch_embed" in name or "embedding" not in name)


@lru_cache(maxsize=64)
def _tower_cast_numel(v: VisionSpec) -> tuple[int, int]:
    """(elements cast once: patch embedding and projector; elements cast per block)."""
    once = per_block = 0
    for name, shape, group in vision_param_tensors(v):
        if not _autocast_cast(name, shape):
            continue
        if group == "vision":
            once += int(np.prod(shape))
        elif group == "vision_block":
            per_block += int(np.prod(shape))
    return once, per_block


def tower_autocast_copy_bytes(m: ModelSpec, *, amp, saving_blocks) -> np.ndarray:
    """Autocast's cached 16-bit copies of a trained tower's fp32 weights, held from their first
    use in forward to the end of backward: the patch embedding's and projector's, and each
    block's that saves for backward (`saving_blocks`: a checkpointed block's come back only
    while it recomputes, as the language model's layers' do).
    Source: aten/src/ATen/autocast_mode.cpp cached_cast (leaf weights that require grad);
    traced: tests/unit/trace/test_vlm_trace.py (LLaVA's CLIP and Gemma 3's SigLIP towers).
    Ignores: Mllama's gated global blocks (their weights are counted as the local blocks')."""
    assert m.vision is not None
    once, per_block = _tower_cast_numel(m.vision)
    return np.where(amp, AUTOCAST_COPY_BYTES * (once + per_block * saving_blocks), 0.0)
