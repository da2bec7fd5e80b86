"""LoRA on a vision-language model's tower and projector: which of their linears PEFT adapts,
the adapters' elements, and what an adapted frozen tower saves beyond its block formulas.

HF Trainer / TRL + PEFT adapt every module the target names match, the tower's included: PEFT's
`all-linear` takes every nn.Linear but the output head (Qwen2-VL's attn.qkv, attn.proj,
mlp.fc1, mlp.fc2, merger.mlp.0 / .2; Qwen2.5-VL's gate / up / down_proj; CLIP's and SigLIP's
q / k / v / out_proj, fc1, fc2, LLaVA's linear_1 / linear_2; Mllama's q / k / v / o_proj, fc1,
fc2 and multi_modal_projector), and a listed name every module whose name ends with it
(`q_proj,v_proj` adapts CLIP's, SigLIP's and Mllama's attention, not Qwen's fused qkv). A row
says which through its `lora_targets` mask (engine/_lora.py: all-linear's bit and each listed
name's literal bit) and `lora_scope`: auto is PEFT's matching, language keeps the tower and
projector unadapted (LLaMA-Factory's patch_target_modules). freeze_vision adapts none of them
either (LLaMA-Factory's freeze_vision_tower forbids the tower's modules; with PEFT alone,
freezing the tower means leaving it out of target_modules: get_peft_model would otherwise add
trainable adapters to it).

Source: peft 0.21.2 tuners/tuners_utils.py (_maybe_include_all_linear_layers,
check_target_module_exists), transformers 5.24.0 modeling_qwen2_vl.py, modeling_qwen2_5_vl.py,
modeling_clip.py, modeling_siglip.py, modeling_llava.py, modeling_mllama.py; LLaMA-Factory
src/llamafactory/model/model_utils/visual.py (patch_target_modules, get_forbidden_modules).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from ._codes import LORA_SCOPE_LANGUAGE
from ._lora import LORA_ALL_LINEAR_BIT, LORA_MODULE_NAMES, LORA_TARGETS, lora_module_bit
from ._vision import TowerLinear, VisionSpec, vision_linears

if TYPE_CHECKING:
    from ._model import ModelSpec
    from ._states import LocalTensor

TOWER_TARGET_NAMES = {
    "qkv": ("q_proj",),
    "proj": ("o_proj",),
    "out_proj": ("o_proj",),
    "fc1": ("up_proj",),
    "fc2": ("down_proj",),
}
"""A tower block linear's name as the block formulas on tower_spec read it (the canonical
LORA_TARGETS; the others are their own). Qwen's fused qkv is one adapter: one input copy and
one [T, r] output, which the formulas count once, for q_proj."""


def tower_lora_rows(c: dict[str, np.ndarray]) -> np.ndarray:
    """Rows whose tower and projector PEFT may adapt: LoRA (lora_rank > 0), lora_scope auto,
    the tower not frozen (freeze_vision: no adapters there)."""
    lora = np.asarray(c.get("lora_rank", 0)) > 0
    frozen = np.asarray(c.get("freeze_vision", False), dtype=bool)
    language = np.asarray(c.get("lora_scope", 0)) == LORA_SCOPE_LANGUAGE
    return lora & ~frozen & ~language


def tower_linear_adapted(linear: TowerLinear, c: dict[str, np.ndarray]) -> np.ndarray:
    """Rows whose LoRA adapts this tower or projector linear: `all-linear`, or its own name
    listed (PEFT's suffix match), on a tower_lora_rows row.
    Source: peft 0.21.2 tuners/tuners_utils.py check_target_module_exists (`key ==
    target_key or key.endswith("." + target_key)`), _maybe_include_all_linear_layers.
    Ignores: regex target_modules (a string other than all-linear)."""
    leaf = linear.leaf
    bits = LORA_ALL_LINEAR_BIT | (lora_module_bit(leaf) if leaf in LORA_MODULE_NAMES else 0)
    mask = np.asarray(c.get("lora_targets", 0), dtype=np.int64)
    return tower_lora_rows(c) & ((mask & bits) != 0)


@lru_cache(maxsize=64)
def _counted_linears(v: VisionSpec) -> tuple[tuple[TowerLinear, float, float], ...]:
    """Each tower linear with (occurrences a gradient reaches, occurrences it does not):
    LLaVA's blocks after its feature layer get none (VisionSpec.num_unused_layers)."""
    out = []
    for lin in vision_linears(v):
        if lin.group == "vision_block":
            out.append((lin, float(v.num_layers - v.num_unused_layers), float(v.num_unused_layers)))
        elif lin.group == "vision_global":
            out.append((lin, float(v.num_global_layers), 0.0))
        else:
            out.append((lin, 1.0, 0.0))
    return tuple(out)


def tower_adapter_numel(v: VisionSpec, c: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(elements of the tower's and projector's adapters a gradient reaches, those it does not):
    r (d_in + d_out) per adapted linear, as PEFT counts them; the second LLaVA's blocks after
    its feature layer, held with no gradient and no optimizer state (as their base weights:
    _vision.unused_vision_block_numel).
    Source: PEFT LoraLayer (lora_A [r, d_in], lora_B [d_out, r]).
    Ignores: SigLIP's pooling head (vision_use_head; Gemma 3 builds none), counted reached."""
    rank = np.asarray(c.get("lora_rank", 0), dtype=np.float64)
    reached = np.zeros_like(rank)
    unreached = np.zeros_like(rank)
    for lin, used, unused in _counted_linears(v):
        width = np.where(tower_linear_adapted(lin, c), rank * (lin.d_in + lin.d_out), 0.0)
        reached = reached + width * used
        unreached = unreached + width * unused
    return reached, unreached


def tower_adapter_tensors(m: ModelSpec, full: Sequence[LocalTensor], c) -> np.ndarray:
    """The adapter matrices (lora_A, lora_B) of the tower's and projector's adapted linears
    among the rank's stepped tensors (`full`: their counts are the first stage's, none where the
    tower is frozen, the blocks a gradient reaches). Source: PEFT LoraLayer."""
    if m.vision is None:
        return np.zeros(np.shape(c["lora_rank"]))
    by_weight = {f"{lin.name}.weight": lin for lin in vision_linears(m.vision)}
    total = np.zeros(np.shape(c["lora_rank"]))
    for t in full:
        lin = by_weight.get(t.tensor.name)
        if lin is not None:
            total = total + np.where(tower_linear_adapted(lin, c), 2.0, 0.0) * t.count
    return total


def tower_lora_targets(v: VisionSpec, c: dict[str, np.ndarray]) -> np.ndarray:
    """The `lora_targets` mask (canonical bits) under which the block formulas run tower_spec:
    each adapted block linear's TOWER_TARGET_NAMES; 0 where none is adapted.
    Assumes: every block is adapted alike (PEFT matches names, the same in every block)."""
    mask = np.zeros(np.shape(c["lora_rank"]), dtype=np.int64)
    for lin in vision_linears(v):
        if lin.group != "vision_block":
            continue
        names = TOWER_TARGET_NAMES.get(lin.leaf, (lin.leaf,))
        bits = sum(1 << LORA_TARGETS.index(n) for n in names if n in LORA_TARGETS)
        mask = mask | np.where(tower_linear_adapted(lin, c), bits, 0)
    return mask


def tower_adapted(v: VisionSpec, c: dict[str, np.ndarray]) -> np.ndarray:
    """Rows with an adapter anywhere in the tower or projector (a gradient path through it)."""
    rows = np.zeros(np.shape(c["lora_rank"]), dtype=bool)
    for lin in vision_linears(v):
        rows = rows | tower_linear_adapted(lin, c)
    return rows


def projector_adapted(v: VisionSpec, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per projector linear's name (Qwen's merger 0 and 2, LLaVA's linear_1 and linear_2,
    Mllama's multi_modal_projector), the rows whose LoRA adapts it."""
    return {
        lin.leaf: tower_linear_adapted(lin, c)
        for lin in vision_linears(v)
        if lin.group == "vision" and ("projector" in lin.name or ".merger." in lin.name)
    }


def adapter_input_bytes(*, e, amp, in_param_dtype) -> np.ndarray:
    """Bytes per element of what an adapter's lora_A keeps of its input: under autocast its
    16-bit cast, for a 16-bit base PEFT's fp32 copy (_cast_input_dtype to lora_A's dtype), for
    an fp32 base (or adapters in the model's dtype) the input itself.
    Source: lora_activation_delta_bytes (engine/_lora.py), peft tuners/lora/layer.py."""
    fp32_copy = (np.asarray(e) < 4) & ~np.asarray(in_param_dtype)
    return np.where(amp, 2.0, np.where(fp32_copy, 4.0, e))


def projector_lora_saved_bytes(
    v: VisionSpec, c: dict[str, np.ndarray], *, images, per_image, e, amp, in_param_dtype, through
) -> np.ndarray:
    """What the frozen projector saves for backward under LoRA: an adapted linear's kept input
    (adapter_input_bytes) and lora_A's [tokens, r] fp32 output; the activation's input between
    two linears where a gradient passes it (`through`: the tower is adapted, or the first
    linear); a frozen linear keeps no input. Qwen's merger: [patches / 4, 4d] per tensor;
    LLaVA's projector: linear_1's input [tokens, vision_output_dim], the GELU's and linear_2's
    [tokens, text hidden]; Mllama's one linear [keys, vision_output_dim]; Gemma 3's (no
    linear: mm_input_projection_weight is a Parameter) AvgPool2d's input and its frozen
    RMSNorm's fp32 input (the normalised product only its weight's gradient needs).
    lora_A's output is fp32 (the model's dtype for adapters in it), as the language model's.
    Source: projector_saved_bytes (_vision_memory.py); peft tuners/lora/layer.py Linear.forward.
    Ignores: the norms' statistics (as projector_saved_bytes)."""
    rank = np.asarray(c["lora_rank"], dtype=np.float64)
    cast = adapter_input_bytes(e=e, amp=amp, in_param_dtype=in_param_dtype)
    a_out = np.where(in_param_dtype, e, 4.0)  # lora_A's output, as the language model's
    on = projector_adapted(v, c)
    d, h, vod = v.hidden_size, v.out_hidden_size, v.vision_output_dim

    def kept(name: str, tokens, width) -> np.ndarray:
        return np.where(on.get(name, False), tokens * (cast * width + a_out * rank), 0.0)

    if v.kind == "gemma3":
        tokens = images * v.image_tokens
        return np.where(through, images * per_image * d * e + tokens * d * 4.0, 0.0)
    if v.kind == "mllama":
        from ._vision import cross_attention_keys_per_image

        keys = images * cross_attention_keys_per_image(v)
        return kept("multi_modal_projector", keys, vod)
    if v.kind == "llava":
        tokens = images * v.image_tokens
        between = np.where(through | on["linear_1"], e * tokens * h, 0.0)
        return kept("linear_1", tokens, vod) + between + kept("linear_2", tokens, h)
    merged = images * per_image / v.spatial_merge_size**2
    width = d * v.spatial_merge_size**2
    between = np.where(through | on["0"], e * merged * width, 0.0)
    return kept("0", merged, width) + between + kept("2", merged, width)


@lru_cache(maxsize=64)
def _frozen_copy_numel(v: VisionSpec) -> tuple[int, int, int]:
    """(elements of the projector's matrices, of one block's linears, of one block's q / k / v
    or fused qkv): what a frozen tower's matmuls save as 16-bit copies under autocast."""
    once = sum(
        lin.d_in * lin.d_out
        for lin in vision_linears(v)
        if lin.group == "vision" and ("projector" in lin.name or ".merger." in lin.name)
    )
    if v.kind == "gemma3":
        once += v.hidden_size * v.out_hidden_size  # mm_input_projection_weight
    block = [lin for lin in vision_linears(v) if lin.group == "vision_block"]
    per_block = sum(lin.d_in * lin.d_out for lin in block)
    qkv = sum(lin.d_in * lin.d_out for lin in block if lin.leaf in ("qkv", "q_proj", "k_proj",
                                                                   "v_proj"))  # fmt: skip
    return once, per_block, qkv


def tower_lora_copy_bytes(v: VisionSpec, *, amp, saving_blocks, tower_on) -> np.ndarray:
    """The 16-bit copies of a frozen tower's weights that its matmuls save under autocast (a
    frozen weight's cast is not cached: each matmul whose input needs a gradient keeps its own
    copy for that gradient): every linear of the blocks that save (`saving_blocks`) but the
    first block's q / k / v (their input, from the frozen patch embedding, needs none), and the
    projector's matrices; none of the patch embedding's. `tower_on`: rows whose tower blocks
    are adapted (else only the projector's linears after an adapted one: none counted).
    Source: aten/src/ATen/autocast_mode.cpp cached_cast (leaf weights that require grad only),
    derivatives.yaml mm (`mat2` saved for `self`'s gradient); as
    lora_first_layer_unsaved_copy_bytes for the language model's layer 0.
    Assumes: the first block's attention is adapted (all-linear, q_proj / v_proj).
    Ignores: the adapters' own cached 16-bit casts (r (d_in + d_out) each)."""
    once, per_block, qkv = _frozen_copy_numel(v)
    blocks = per_block * saving_blocks - qkv * np.minimum(saving_blocks, 1.0)
    return np.where(np.asarray(amp) & np.asarray(tower_on), 2.0 * (once + blocks), 0.0)
