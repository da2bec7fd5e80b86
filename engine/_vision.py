"""Vision-language models: the vision tower and projector of a VLM (VisionSpec), their parameter
tensors, and the image tokens the processors make of an image.

A VLM's ModelSpec is its language model (read by the decoder reader from the text part of the
config.json) plus `vision` (this module's VisionSpec) and, for Llama 3.2 Vision, the language
model's cross-attention layers (ModelSpec.num_cross_attention_layers). The tower's tensors are in
the parameter groups "vision" (once: patch embedding, positions, merger / projector),
"vision_block" (every encoder block) and "vision_global" (Mllama's gated global blocks); they sit
on the first pipeline stage, replicated under tensor parallelism (transformers' tp_plan of these
models leaves the tower unsharded).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

VisionKind = Literal["qwen2_vl", "qwen2_5_vl", "mllama", "llava", "gemma3"]
VisionGroup = Literal["vision", "vision_block", "vision_global"]
VLM_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "mllama", "llava", "gemma3")
"""config.json model_types read as vision-language models (_model_readers.model_from_hf_config)."""


def is_vlm_config(config: dict[str, Any]) -> bool:
    """Whether a config.json is read as a vision-language model: a VLM_MODEL_TYPES model_type,
    Gemma 3 only with a vision_config (Gemma3ForConditionalGeneration; a text-only gemma3
    config is its language model)."""
    raw = config.get("model_type")
    model_type = raw.lower() if isinstance(raw, str) else ""
    if model_type == "gemma3":
        return isinstance(config.get("vision_config"), dict)
    return model_type in VLM_MODEL_TYPES


@dataclass(frozen=True, slots=True, kw_only=True)
class VisionSpec:
    """A VLM's vision tower and projector, in its config.json's vision_config field names."""

    kind: VisionKind
    hidden_size: int
    """The tower's width (Qwen2-VL embed_dim, Qwen2.5-VL / Mllama hidden_size)."""
    intermediate_size: int
    """The blocks' MLP width (Qwen2-VL: embed_dim x mlp_ratio)."""
    num_layers: int
    """Encoder blocks (Qwen depth; Mllama num_hidden_layers, the local encoder)."""
    num_heads: int
    patch_size: int
    in_channels: int = 3
    out_hidden_size: int
    """The projector's output: the language model's hidden size (Qwen out_hidden_size / Qwen2-VL
    hidden_size; Mllama text hidden_size)."""
    temporal_patch_size: int = 1
    """Qwen2-VL / 2.5-VL: frames per patch (an image is repeated to 2 frames)."""
    spatial_merge_size: int = 1
    """Qwen2-VL / 2.5-VL: the merger joins merge x merge patches into one token."""
    window_size: int = 0
    """Qwen2.5-VL: the window attention's side in pixels (112: 8 x 8 patches, 4 x 4 tokens)."""
    num_full_attention_blocks: int = 0
    """Qwen2.5-VL: blocks in fullatt_block_indexes (full attention over the image; the others
    attend within windows)."""
    num_global_layers: int = 0
    """Mllama: the gated global encoder's blocks after the local ones."""
    image_size: int = 0
    """Mllama: a tile's side in pixels (560)."""
    max_num_tiles: int = 1
    """Mllama: tiles an image is cut into at most (4)."""
    num_aspect_ratios: int = 0
    """Mllama: len(supported_aspect_ratios) (8); the tile embeddings have one more row."""
    vision_output_dim: int = 0
    """Mllama: the projector's input, hidden_size x (len(intermediate_layers_indices) + 1);
    LLaVA: hidden_size x len(vision_feature_layer)."""
    hidden_act: str = ""
    """LLaVA's CLIP / Gemma 3's SigLIP tower: the blocks' MLP activation (quick_gelu,
    gelu_pytorch_tanh, ...)."""
    class_token: bool = False
    """LLaVA's CLIP tower: a class embedding before the patches (577 positions at 336 / 14)."""
    num_unused_layers: int = 0
    """LLaVA: the tower's blocks after vision_feature_layer (-2: the last one). They run, but
    nothing the loss reads depends on them: their parameters get no gradient (None), hence no
    optimizer state, and what they save is freed with the model's outputs before backward."""
    image_tokens: int = 0
    """LLaVA / Gemma 3: the language model's tokens per image, fixed by the processor (LLaVA:
    the patches, plus the class token under vision_feature_select_strategy "full"; Gemma 3
    mm_tokens_per_image, 256)."""
    projector_bias: bool = True
    """LLaVA: multimodal_projector_bias."""
    vision_use_head: bool = False
    """Gemma 3's SigLIP: the attention-pooling head (SiglipMultiheadAttentionPoolingHead) is
    built; Gemma 3 reads last_hidden_state, so it never gets a gradient."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def vit_positions(self) -> int:
        """LLaVA's CLIP / Gemma 3's SigLIP: positions of one image in the tower's blocks."""
        return vit_positions(self.image_size, self.patch_size, class_token=self.class_token)

    @property
    def patches_per_tile(self) -> int:
        """Mllama: (image_size / patch_size)^2 patches plus the class token (1601 at 560/14)."""
        return (self.image_size // self.patch_size) ** 2 + 1


def vit_positions(image_size: int, patch_size: int, *, class_token: bool) -> int:
    """(image_size / patch_size)^2 patches, and CLIP's class token before them (577 at
    336 / 14). Source: modeling_clip.py CLIPVisionEmbeddings, modeling_siglip.py
    SiglipVisionEmbeddings (num_patches, num_positions)."""
    return (image_size // patch_size) ** 2 + int(class_token)


@dataclass(frozen=True, slots=True, kw_only=True)
class TowerLinear:
    """One nn.Linear of the tower or projector (per block for the block groups)."""

    name: str
    """The module's path, e.g. visual.blocks.attn.qkv (its weight is `name`.weight)."""
    d_out: int
    d_in: int
    group: VisionGroup

    @property
    def leaf(self) -> str:
        """The module's own name, which PEFT's target names match (qkv, fc1, linear_1, 0)."""
        return self.name.rpartition(".")[2]


class _Tensors:
    """The (name, shape, group) list a tower's inventory is written into."""

    def __init__(self) -> None:
        self.out: list[tuple[str, tuple[int, ...], VisionGroup]] = []
        self.linears: list[TowerLinear] = []

    def add(self, name: str, shape: tuple[int, ...], group: VisionGroup) -> None:
        self.out.append((name, shape, group))

    def linear(self, name: str, o: int, i: int, group: VisionGroup, bias: bool = True) -> None:
        self.linears.append(TowerLinear(name=name, d_out=o, d_in=i, group=group))
        self.add(f"{name}.weight", (o, i), group)
        if bias:
            self.add(f"{name}.bias", (o,), group)

    def norm(self, name: str, group: VisionGroup, width: int, bias: bool) -> None:
        self.add(f"{name}.weight", (width,), group)
        if bias:
            self.add(f"{name}.bias", (width,), group)


def vision_param_tensors(v: VisionSpec) -> list[tuple[str, tuple[int, ...], VisionGroup]]:
    """Every parameter tensor of the tower and projector: (name, shape, group), per block for
    the block groups.

    Source: transformers 5.24.0 modeling_qwen2_vl.py (PatchEmbed Conv3d without bias,
    Qwen2VLVisionBlock: LayerNorm norm1/norm2, attn.qkv / attn.proj with bias, VisionMlp fc1/fc2;
    PatchMerger: ln_q LayerNorm, mlp Linear(d m^2, d m^2), GELU, Linear(d m^2, out)),
    modeling_qwen2_5_vl.py (RMSNorm norms and ln_q, a gated MLP gate/up/down with biases),
    modeling_mllama.py (MllamaVisionModel: class_embedding, patch_embedding Conv2d without bias,
    gated positional embedding [patches, d] + tile embedding [ratios + 1, tiles x patches x d],
    pre/post tile embeddings [ratios + 1, tiles x d] with gates, layernorm_pre/post; encoder
    layers q/k/v/o without bias, fc1/fc2 with bias, two LayerNorms; the global layers add
    gate_attn / gate_ffn; multi_modal_projector Linear(vision_output_dim, text hidden)).
    """
    return _tower_tensors(v).out


def vision_linears(v: VisionSpec) -> list[TowerLinear]:
    """The tower's and projector's nn.Linear modules, in vision_param_tensors' order (not the
    Conv patch embedding, nor Gemma 3's mm_input_projection_weight, a bare Parameter): what
    PEFT's LoRA can adapt. Source: vision_param_tensors' files."""
    return _tower_tensors(v).linears


def _tower_tensors(v: VisionSpec) -> _Tensors:
    t = _Tensors()
    if v.kind in ("qwen2_vl", "qwen2_5_vl"):
        _qwen_vision_tensors(v, t)
    elif v.kind == "mllama":
        _mllama_vision_tensors(v, t)
    else:
        _vit_vision_tensors(v, t)
    return t


def _qwen_vision_tensors(v: VisionSpec, t: _Tensors) -> None:
    """Qwen2-VL / Qwen2.5-VL: patch embedding, blocks, patch merger (vision_param_tensors)."""
    d, f, c, p = v.hidden_size, v.intermediate_size, v.in_channels, v.patch_size
    layernorm = v.kind == "qwen2_vl"  # Qwen2.5-VL: RMSNorm (weight only)
    t.add("visual.patch_embed.proj.weight", (d, c, v.temporal_patch_size, p, p), "vision")
    t.norm("visual.blocks.norm1", "vision_block", d, layernorm)
    t.norm("visual.blocks.norm2", "vision_block", d, layernorm)
    t.linear("visual.blocks.attn.qkv", 3 * d, d, "vision_block")
    t.linear("visual.blocks.attn.proj", d, d, "vision_block")
    if v.kind == "qwen2_vl":
        t.linear("visual.blocks.mlp.fc1", f, d, "vision_block")
        t.linear("visual.blocks.mlp.fc2", d, f, "vision_block")
    else:
        t.linear("visual.blocks.mlp.gate_proj", f, d, "vision_block")
        t.linear("visual.blocks.mlp.up_proj", f, d, "vision_block")
        t.linear("visual.blocks.mlp.down_proj", d, f, "vision_block")
    merged = d * v.spatial_merge_size**2
    t.norm("visual.merger.ln_q", "vision", d, layernorm)
    t.linear("visual.merger.mlp.0", merged, merged, "vision")
    t.linear("visual.merger.mlp.2", v.out_hidden_size, merged, "vision")


def _mllama_vision_tensors(v: VisionSpec, t: _Tensors) -> None:
    """Llama 3.2 Vision (Mllama): embeddings, local and global encoders, projector
    (vision_param_tensors)."""
    d, f, c, p = v.hidden_size, v.intermediate_size, v.in_channels, v.patch_size
    patches, ratios, tiles = v.patches_per_tile, v.num_aspect_ratios + 1, v.max_num_tiles
    t.add("vision_model.class_embedding", (d,), "vision")
    t.add("vision_model.patch_embedding.weight", (d, c, p, p), "vision")
    t.add("vision_model.gated_positional_embedding.gate", (1,), "vision")
    t.add("vision_model.gated_positional_embedding.embedding", (patches, d), "vision")
    t.add("vision_model.gated_positional_embedding.tile_embedding.weight",
          (ratios, tiles * patches * d), "vision")  # fmt: skip
    for name in ("pre_tile_positional_embedding", "post_tile_positional_embedding"):
        t.add(f"vision_model.{name}.gate", (1,), "vision")
        t.add(f"vision_model.{name}.embedding.weight", (ratios, tiles * d), "vision")
    t.norm("vision_model.layernorm_pre", "vision", d, True)
    t.norm("vision_model.layernorm_post", "vision", d, True)
    stacks: tuple[tuple[str, VisionGroup], ...] = (
        ("transformer", "vision_block"),
        ("global_transformer", "vision_global"),
    )
    for prefix, group in stacks:
        layer = f"vision_model.{prefix}.layers"
        if group == "vision_global":
            t.add(f"{layer}.gate_attn", (1,), group)
            t.add(f"{layer}.gate_ffn", (1,), group)
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t.linear(f"{layer}.self_attn.{proj}", d, d, group, bias=False)
        t.linear(f"{layer}.mlp.fc1", f, d, group)
        t.linear(f"{layer}.mlp.fc2", d, f, group)
        t.norm(f"{layer}.input_layernorm", group, d, True)
        t.norm(f"{layer}.post_attention_layernorm", group, d, True)
    t.linear("multi_modal_projector", v.out_hidden_size, v.vision_output_dim, "vision")


def _vit_vision_tensors(v: VisionSpec, t: _Tensors) -> None:
    """LLaVA's CLIP tower (CLIPVisionModel: class embedding, Conv2d patch embedding without
    bias, positions [patches + 1, d], pre_layrnorm; blocks of q/k/v/out_proj with biases,
    fc1/fc2 with biases, layer_norm1/2; post_layernorm) and LlavaMultiModalProjector (linear_1,
    GELU, linear_2); Gemma 3's SigLIP tower (SiglipVisionModel: Conv2d patch embedding with bias,
    positions [patches, d], the same blocks, post_layernorm) and Gemma3MultiModalProjector
    (mm_input_projection_weight [d, text hidden], mm_soft_emb_norm RMSNorm(d)). The blocks after
    LLaVA's feature layer and the tensors no output reads are listed here as every other
    (counted as parameters; VisionSpec.num_unused_layers says which blocks get no gradient).
    Source: transformers 5.24.0 modeling_clip.py, modeling_siglip.py, modeling_llava.py,
    modeling_gemma3.py."""
    d, f, c, p = v.hidden_size, v.intermediate_size, v.in_channels, v.patch_size
    clip = v.class_token  # CLIP's layout; SigLIP's otherwise
    emb = "vision_tower.vision_model.embeddings"
    if clip:
        t.add(f"{emb}.class_embedding", (d,), "vision")
    t.add(f"{emb}.patch_embedding.weight", (d, c, p, p), "vision")
    if not clip:
        t.add(f"{emb}.patch_embedding.bias", (d,), "vision")
    t.add(f"{emb}.position_embedding.weight", (v.vit_positions, d), "vision")
    if clip:
        t.norm("vision_tower.vision_model.pre_layrnorm", "vision", d, True)
    layer = "vision_tower.vision_model.encoder.layers"
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        t.linear(f"{layer}.self_attn.{proj}", d, d, "vision_block")
    t.norm(f"{layer}.layer_norm1", "vision_block", d, True)
    t.linear(f"{layer}.mlp.fc1", f, d, "vision_block")
    t.linear(f"{layer}.mlp.fc2", d, f, "vision_block")
    t.norm(f"{layer}.layer_norm2", "vision_block", d, True)
    t.norm("vision_tower.vision_model.post_layernorm", "vision", d, True)
    if v.vision_use_head:
        head = "vision_tower.vision_model.head"
        t.add(f"{head}.probe", (1, 1, d), "vision")
        t.add(f"{head}.attention.in_proj_weight", (3 * d, d), "vision")
        t.add(f"{head}.attention.in_proj_bias", (3 * d,), "vision")
        t.linear(f"{head}.attention.out_proj", d, d, "vision")
        t.norm(f"{head}.layernorm", "vision", d, True)
        t.linear(f"{head}.mlp.fc1", f, d, "vision")
        t.linear(f"{head}.mlp.fc2", d, f, "vision")
    if v.kind == "llava":
        h, bias = v.out_hidden_size, v.projector_bias
        t.linear("multi_modal_projector.linear_1", h, v.vision_output_dim, "vision", bias)
        t.linear("multi_modal_projector.linear_2", h, h, "vision", bias)
    else:
        t.add("multi_modal_projector.mm_input_projection_weight", (d, v.out_hidden_size),
              "vision")  # fmt: skip
        t.norm("multi_modal_projector.mm_soft_emb_norm", "vision", d, False)


def unused_vision_block_numel(v: VisionSpec) -> int:
    """Elements of LLaVA's tower blocks after vision_feature_layer: held, but no loss gradient
    reaches them (gradient None, no optimizer state).
    Source: modeling_llava.py get_image_features (hidden_states[vision_feature_layer])."""
    block = sum(math.prod(s) for _, s, g in vision_param_tensors(v) if g == "vision_block")
    return v.num_unused_layers * block


def vision_group_count(v: VisionSpec, group: str) -> int:
    """How many times a vision group's tensors occur."""
    if group == "vision_block":
        return v.num_layers
    if group == "vision_global":
        return v.num_global_layers
    return 1


# ------------------------------------------------------------------------- config.json reading


def _int(config: dict[str, Any], key: str, *, name: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"model: {name}: vision_config.{key} must be an integer >= 1, got {value!r}"
        )
    return value


LLAVA_VISION_DEFAULTS: dict[str, Any] = {
    "model_type": "clip_vision_model",
    "intermediate_size": 4096,
    "hidden_size": 1024,
    "patch_size": 14,
    "image_size": 336,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
}
"""LlavaConfig's vision_config when the config.json has none (CLIP ViT-L/14 at 336 pixels).
Source: transformers 5.24.0 configuration_llava.py sub_configs_defaults."""
VIT_TOWER_DEFAULTS: dict[str, dict[str, Any]] = {
    "clip_vision_model": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                          "num_attention_heads": 12, "num_channels": 3, "image_size": 224,
                          "patch_size": 32, "hidden_act": "quick_gelu"},
    "siglip_vision_model": {"hidden_size": 768, "intermediate_size": 3072,
                            "num_hidden_layers": 12, "num_attention_heads": 12, "num_channels": 3,
                            "image_size": 224, "patch_size": 16,
                            "hidden_act": "gelu_pytorch_tanh", "vision_use_head": True},
}  # fmt: skip
"""CLIPVisionConfig's and SiglipVisionConfig's defaults for the fields a vision_config omits.
Source: transformers 5.24.0 configuration_clip.py, configuration_siglip.py."""


def vision_config(config: dict[str, Any], *, name: str) -> dict[str, Any]:
    """The config.json's vision_config object (a one-line ValueError when absent or not one)."""
    vc = config.get("vision_config")
    if vc is None and str(config.get("model_type")).lower() == "llava":
        return dict(LLAVA_VISION_DEFAULTS)
    if not isinstance(vc, dict):
        raise ValueError(f"model: {name}: vision_config must be an object, got {vc!r}")
    return vc


def read_vision_spec(
    config: dict[str, Any], *, model_type: str, text_hidden_size: int, name: str
) -> VisionSpec:
    """The VisionSpec of a qwen2_vl / qwen2_5_vl / mllama config.json, with the defaults of
    transformers 5.24.0's Qwen2VLVisionConfig, Qwen2_5_VLVisionConfig and MllamaVisionConfig
    where a field is absent."""
    vc = vision_config(config, name=name)
    if model_type == "qwen2_vl":
        return _qwen2_vl_spec(vc, name=name)
    if model_type == "qwen2_5_vl":
        return _qwen2_5_vl_spec(vc, name=name)
    if model_type == "llava":
        return _llava_spec(config, vc, text_hidden_size=text_hidden_size, name=name)
    if model_type == "gemma3":
        return _gemma3_vision_spec(config, vc, text_hidden_size=text_hidden_size, name=name)
    return _mllama_spec(vc, text_hidden_size=text_hidden_size, name=name)


def _qwen_patch_fields(vc: dict[str, Any], *, name: str) -> dict[str, Any]:
    """The fields Qwen2-VL's and Qwen2.5-VL's vision configs share, with their defaults:
    heads, the patch embedding's patch, channels and temporal patch, the merger's merge size."""
    return {
        "num_heads": _int(vc, "num_heads", name=name, default=16),
        "patch_size": _int(vc, "patch_size", name=name, default=14),
        "in_channels": _int(vc, "in_channels", name=name, default=vc.get("in_chans", 3)),
        "temporal_patch_size": _int(vc, "temporal_patch_size", name=name, default=2),
        "spatial_merge_size": _int(vc, "spatial_merge_size", name=name, default=2),
    }


def _qwen2_vl_spec(vc: dict[str, Any], *, name: str) -> VisionSpec:
    """Qwen2VLVisionConfig's fields (read_vision_spec)."""
    d = _int(vc, "embed_dim", name=name, default=1280)
    return VisionSpec(
        kind="qwen2_vl",
        hidden_size=d,
        intermediate_size=int(d * float(vc.get("mlp_ratio", 4))),
        num_layers=_int(vc, "depth", name=name, default=32),
        out_hidden_size=_int(vc, "hidden_size", name=name, default=3584),
        **_qwen_patch_fields(vc, name=name),
    )


def _qwen2_5_vl_spec(vc: dict[str, Any], *, name: str) -> VisionSpec:
    """Qwen2_5_VLVisionConfig's fields (read_vision_spec)."""
    depth = _int(vc, "depth", name=name, default=32)
    full = vc.get("fullatt_block_indexes", [7, 15, 23, 31])
    if not isinstance(full, list) or any(
        isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < depth for i in full
    ):
        raise ValueError(
            f"model: {name}: vision_config.fullatt_block_indexes must list block indexes "
            f"in [0, {depth}), got {full!r}"
        )
    return VisionSpec(
        kind="qwen2_5_vl",
        hidden_size=_int(vc, "hidden_size", name=name, default=1280),
        intermediate_size=_int(vc, "intermediate_size", name=name, default=3420),
        num_layers=depth,
        out_hidden_size=_int(vc, "out_hidden_size", name=name, default=3584),
        **_qwen_patch_fields(vc, name=name),
        window_size=_int(vc, "window_size", name=name, default=112),
        num_full_attention_blocks=len(set(full)),
    )


def _mllama_spec(vc: dict[str, Any], *, text_hidden_size: int, name: str) -> VisionSpec:
    """MllamaVisionConfig's fields (read_vision_spec)."""
    ratios = vc.get("supported_aspect_ratios", [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2],
                                                [3, 1], [4, 1]])  # fmt: skip
    if not isinstance(ratios, list) or not ratios:
        raise ValueError(
            f"model: {name}: vision_config.supported_aspect_ratios must be a non-empty list, "
            f"got {ratios!r}"
        )
    layers = vc.get("intermediate_layers_indices", [3, 7, 15, 23, 30])
    if not isinstance(layers, list):
        raise ValueError(
            f"model: {name}: vision_config.intermediate_layers_indices must be a list, "
            f"got {layers!r}"
        )
    d = _int(vc, "hidden_size", name=name, default=1280)
    heads_key = "attention_heads" if "attention_heads" in vc else "num_attention_heads"
    return VisionSpec(
        kind="mllama",
        hidden_size=d,
        intermediate_size=_int(vc, "intermediate_size", name=name, default=5120),
        num_layers=_int(vc, "num_hidden_layers", name=name, default=32),
        num_heads=_int(vc, heads_key, name=name, default=16),
        patch_size=_int(vc, "patch_size", name=name, default=14),
        in_channels=_int(vc, "num_channels", name=name, default=3),
        out_hidden_size=text_hidden_size,
        num_global_layers=_int(vc, "num_global_layers", name=name, default=8),
        image_size=_int(vc, "image_size", name=name, default=560),
        max_num_tiles=_int(vc, "max_num_tiles", name=name, default=4),
        num_aspect_ratios=len(ratios),
        vision_output_dim=_int(vc, "vision_output_dim", name=name, default=d * (len(layers) + 1)),
    )


def _vit_tower_fields(vc: dict[str, Any], *, name: str) -> dict[str, Any]:
    """A CLIP or SigLIP vision_config's tower fields, with its config class's defaults."""
    tower = str(vc.get("model_type", "clip_vision_model"))
    if tower not in VIT_TOWER_DEFAULTS:
        raise ValueError(
            f"model: {name}: vision_config.model_type must be one of "
            f"{', '.join(VIT_TOWER_DEFAULTS)}, got {tower!r}"
        )
    full = {**VIT_TOWER_DEFAULTS[tower], **vc}
    act = full["hidden_act"]
    if not isinstance(act, str):
        raise ValueError(f"model: {name}: vision_config.hidden_act must be a string, got {act!r}")
    return {
        "hidden_size": _int(full, "hidden_size", name=name),
        "intermediate_size": _int(full, "intermediate_size", name=name),
        "num_layers": _int(full, "num_hidden_layers", name=name),
        "num_heads": _int(full, "num_attention_heads", name=name),
        "patch_size": _int(full, "patch_size", name=name),
        "in_channels": _int(full, "num_channels", name=name),
        "image_size": _int(full, "image_size", name=name),
        "hidden_act": act,
        "class_token": tower == "clip_vision_model",
        "vision_use_head": tower == "siglip_vision_model" and bool(full["vision_use_head"]),
    }


def _llava_spec(
    config: dict[str, Any], vc: dict[str, Any], *, text_hidden_size: int, name: str
) -> VisionSpec:
    """LlavaConfig's fields (read_vision_spec): the tower, vision_feature_layer (an index into
    the tower's L + 1 hidden states, or a list of them, concatenated), the select strategy
    ("default" drops the class token) and the projector's bias.
    Source: transformers 5.24.0 configuration_llava.py, modeling_llava.py get_image_features."""
    tower = _vit_tower_fields(vc, name=name)
    layers = tower["num_layers"]
    feature = config.get("vision_feature_layer", -2)
    indexes = feature if isinstance(feature, list) else [feature]
    if not indexes or any(
        isinstance(i, bool) or not isinstance(i, int) or not -(layers + 1) <= i <= layers
        for i in indexes
    ):
        raise ValueError(
            f"model: {name}: vision_feature_layer must be an index (or a list of indexes) into "
            f"the tower's {layers + 1} hidden states, got {feature!r}"
        )
    deepest = max(i % (layers + 1) for i in indexes)  # hidden_states[k]: after block k
    strategy = config.get("vision_feature_select_strategy", "default")
    if strategy not in ("default", "full"):
        raise ValueError(
            f"model: {name}: vision_feature_select_strategy must be default or full, "
            f"got {strategy!r}"
        )
    patches = vit_positions(
        tower["image_size"], tower["patch_size"], class_token=tower["class_token"]
    )
    return VisionSpec(
        kind="llava",
        **tower,
        out_hidden_size=text_hidden_size,
        vision_output_dim=tower["hidden_size"] * len(indexes),
        num_unused_layers=layers - deepest,
        image_tokens=patches - (1 if strategy == "default" else 0),
        projector_bias=bool(config.get("multimodal_projector_bias", True)),
    )


def _gemma3_vision_spec(
    config: dict[str, Any], vc: dict[str, Any], *, text_hidden_size: int, name: str
) -> VisionSpec:
    """Gemma3Config's vision fields (read_vision_spec): the SigLIP tower and mm_tokens_per_image
    (a square number dividing the patch grid: the projector average-pools to it).
    Source: transformers 5.24.0 configuration_gemma3.py, Gemma3MultiModalProjector."""
    tower = _vit_tower_fields({"model_type": "siglip_vision_model", **vc}, name=name)
    tokens = config.get("mm_tokens_per_image", 256)
    side = tower["image_size"] // tower["patch_size"]
    per_side = math.isqrt(tokens) if isinstance(tokens, int) and tokens > 0 else 0
    if isinstance(tokens, bool) or per_side < 1 or per_side**2 != tokens or side % per_side:
        raise ValueError(
            f"model: {name}: mm_tokens_per_image must be a square whose side divides the "
            f"tower's {side} patches per side, got {tokens!r}"
        )
    return VisionSpec(kind="gemma3", **tower, out_hidden_size=text_hidden_size, image_tokens=tokens)


# ------------------------------------------------------------------------- image tokens

QWEN_MIN_PIXELS = 56 * 56
"""Qwen2VLImageProcessor's default size["shortest_edge"] (min_pixels): 3,136.
Source: transformers 5.24.0 image_processing_qwen2_vl.py."""
QWEN_MAX_PIXELS = 28 * 28 * 1280
"""Qwen2VLImageProcessor's default size["longest_edge"] (max_pixels): 1,003,520 (the
Qwen2.5-VL-7B-Instruct preprocessor_config.json sets 12,845,056; the user's image_size is
square and within both for the sizes fine-tuning uses)."""


def qwen_resized_side(side_px, *, factor: int, min_pixels: int, max_pixels: int) -> np.ndarray:
    """The side (pixels) a square image of `side_px` is resized to by smart_resize: rounded to a
    multiple of `factor` (patch x merge = 28), then scaled down or up to keep h x w within
    [min_pixels, max_pixels].

    Source: transformers 5.24.0 models/qwen2_vl/image_processing_qwen2_vl.py smart_resize.
    Assumes: a square image (h = w), so the aspect-ratio check never fires.
    """
    side = np.asarray(side_px, dtype=np.float64)
    bar = np.round(side / factor) * factor  # Python's round and numpy's: half to even
    area = bar * bar
    beta_down = np.sqrt(side * side / max_pixels)
    down = np.maximum(factor, np.floor(side / beta_down / factor) * factor)
    beta_up = np.sqrt(min_pixels / np.maximum(side * side, 1.0))
    up = np.ceil(side * beta_up / factor) * factor
    return np.where(area > max_pixels, down, np.where(area < min_pixels, up, bar))


def qwen_image_patches(v: VisionSpec, image_size_px) -> np.ndarray:
    """Vision patches of one square image in the tower: (h / 14)(w / 14) after smart_resize
    (the temporal pair of frames makes one patch of 2 x 14 x 14 pixels).
    Source: image_processing_qwen2_vl.py (grid_t = 1 for an image, grid_h = h / patch_size)."""
    factor = v.patch_size * v.spatial_merge_size
    side = qwen_resized_side(
        image_size_px, factor=factor, min_pixels=QWEN_MIN_PIXELS, max_pixels=QWEN_MAX_PIXELS
    )
    return (side / v.patch_size) ** 2


def image_tokens_per_image(v: VisionSpec, image_size_px) -> np.ndarray:
    """The tokens one image adds to the language model's sequence: Qwen2-VL / 2.5-VL
    (h / 28)(w / 28) placeholders (patches / merge^2); Mllama none (its cross-attention layers
    read the vision states; the one <|image|> token is text); LLaVA the tower's patches (576 at
    336 / 14; 577 with the class token under the "full" strategy) and Gemma 3
    mm_tokens_per_image (256), whatever the image's size: their processors resize every image to
    the tower's side (CLIPImageProcessor's resize and center crop, Gemma3ImageProcessor without
    pan-and-scan).
    Source: processing_qwen2_vl.py (image_grid_thw.prod() // merge_size**2 <|image_pad|> tokens
    per image); processing_mllama.py; processing_llava.py (num_image_tokens); processing_gemma3.py
    (image_seq_length <image_soft_token>s).
    Ignores: Gemma 3's markup around them ("\\n\\n<start_of_image>" ... "<end_of_image>\\n\\n"),
    text tokens counted in seq_len."""
    if v.kind == "mllama":
        return np.zeros_like(np.asarray(image_size_px, dtype=np.float64))
    if v.image_tokens:  # LLaVA / Gemma 3: every image is resized to the tower's size
        return np.full_like(np.asarray(image_size_px, dtype=np.float64), float(v.image_tokens))
    return qwen_image_patches(v, image_size_px) / v.spatial_merge_size**2


def mllama_tiles(v: VisionSpec, image_size_px) -> np.ndarray:
    """Tiles of 560 x 560 a square image becomes: ceil(side / 560)^2, at most max_num_tiles (a
    square image larger than a tile uses the 2 x 2 canvas at 4 tiles).
    Source: transformers 5.24.0 image_processing_mllama.py get_optimal_tiled_canvas (the
    canvas that upscales least / downscales least among supported_aspect_ratios)."""
    side = np.asarray(image_size_px, dtype=np.float64)
    per_side = np.ceil(side / v.image_size)
    best = math.isqrt(v.max_num_tiles)
    return np.minimum(per_side, best) ** 2


def vision_sequence_per_image(v: VisionSpec, image_size_px) -> np.ndarray:
    """Positions one image has in the tower's blocks: Qwen: its patches; LLaVA's CLIP its
    (image_size / patch)^2 patches and the class token, Gemma 3's SigLIP the patches; Mllama:
    max_num_tiles x the tile's patches padded to a multiple of 8 (the processor pads every image to
    max_num_tiles tiles, MllamaVisionModel pads 1601 patches to 1608).
    Source: modeling_mllama.py MllamaVisionModel.forward (num_padding_patches = (8 - n % 8) % 8);
    image_processing_mllama.py pack_images (max_image_tiles tiles per image)."""
    if v.kind == "mllama":
        n = v.patches_per_tile
        padded = n + (8 - n % 8) % 8
        return np.full_like(np.asarray(image_size_px, dtype=np.float64), v.max_num_tiles * padded)
    if v.kind in ("llava", "gemma3"):
        return np.full_like(np.asarray(image_size_px, dtype=np.float64), float(v.vit_positions))
    return qwen_image_patches(v, image_size_px)


def cross_attention_keys_per_image(v: VisionSpec) -> int:
    """Mllama: keys each cross-attention layer attends over per image: max_num_tiles x 1601
    (the padding patches are sliced off before the projector).
    Source: modeling_mllama.py (cross_attention_states reshaped to [b, images x tiles x
    patches, hidden])."""
    return v.max_num_tiles * v.patches_per_tile
