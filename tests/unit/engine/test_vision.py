"""Vision-language models (issue 29): readers, parameter counts against PyTorch's, image tokens.

The preset totals are checked in tests/golden/test_param_counts.py (tests/data/param_counts.json);
here the split by module, the tensor counts and the readers of layouts without a preset, each
against a count PyTorch printed for the same config (transformers 5.24.0, meta device:
`sum(p.numel() for p in AutoModelForImageTextToText.from_config(cfg).parameters())`). Exact:
integers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainmem.catalog import load_model
from trainmem.engine import model_from_hf_config
from trainmem.engine._vision import (
    cross_attention_keys_per_image,
    image_tokens_per_image,
    mllama_tiles,
    qwen_resized_side,
    vision_sequence_per_image,
)

PARAM_COUNTS = json.loads((Path(__file__).parents[2] / "data" / "param_counts.json").read_text())

QWEN2_VL_7B_LAYOUT = {
    "model_type": "qwen2_vl",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "vision_config": {
        "depth": 32,
        "embed_dim": 1280,
        "mlp_ratio": 4,
        "num_heads": 16,
        "in_chans": 3,
        "hidden_size": 3584,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}
"""Qwen2-VL-7B's layout (the model card's 8.29B; no preset ships it)."""
QWEN2_VL_TINY = {
    "model_type": "qwen2_vl",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "tie_word_embeddings": True,
    "vision_config": {
        "depth": 2,
        "embed_dim": 32,
        "mlp_ratio": 4,
        "num_heads": 4,
        "hidden_size": 64,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}


@pytest.mark.parametrize(
    ("config", "num_parameters", "num_tensors"),
    [
        # PyTorch: 8,291,375,616 parameters in 730 tensors; 194,944 in 57 (tied lm_head).
        (QWEN2_VL_7B_LAYOUT, 8_291_375_616, 730),
        (QWEN2_VL_TINY, 194_944, 57),
    ],
)
def test_qwen2_vl_counts_equal_pytorch(config, num_parameters, num_tensors) -> None:
    m = model_from_hf_config(config, name="qwen2-vl")
    assert m.num_parameters == num_parameters
    assert m.num_param_tensors == num_tensors


@pytest.mark.parametrize("name", ["qwen2.5-vl-7b", "llama-3.2-11b-vision", "llava-1.5-7b"])
def test_preset_split_and_tensors_equal_pytorch(name: str) -> None:
    """The tower (+ projector) and the language model separately, and the tensor count."""
    ref = PARAM_COUNTS[name]
    m = load_model(name)
    vision = sum(
        p.numel * m.group_count(p.group)
        for p in m.param_tensors()
        if p.group in ("vision", "vision_block", "vision_global")
    )
    parts = ref["parts"]
    tower = parts.get("visual", 0) + parts.get("vision_model", 0) + parts.get("vision_tower", 0)
    assert vision == tower + parts.get("multi_modal_projector", 0)
    assert m.num_param_tensors == ref["num_param_tensors"]
    if name == "llama-3.2-11b-vision":
        assert m.num_cross_attention_layers == ref["cross_attention_layers"]


def test_vlm_presets_read_their_towers() -> None:
    q = load_model("qwen2.5-vl-7b")
    assert q.vision is not None and q.vision.kind == "qwen2_5_vl"
    assert (q.vision.num_layers, q.vision.num_full_attention_blocks) == (32, 4)
    ll = load_model("llama-3.2-11b-vision")
    assert ll.vision is not None and ll.vision.patches_per_tile == 1601
    assert (ll.vision.num_layers, ll.vision.num_global_layers) == (32, 8)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"vision_config": None}, "vision_config must be an object"),
        ({"vision_config": {"depth": 0}}, "vision_config.depth must be an integer >= 1"),
        (
            {"vision_config": {"fullatt_block_indexes": [40]}},
            "vision_config.fullatt_block_indexes must list block indexes",
        ),
    ],
)
def test_bad_vision_config_is_one_line_error(change, message) -> None:
    config = {**QWEN2_VL_TINY, "model_type": "qwen2_5_vl", **change}
    with pytest.raises(ValueError, match=message):
        model_from_hf_config(config, name="bad")


def test_mllama_cross_attention_layers_checked() -> None:
    text = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 99,
            "cross_attention_layers": [7]}  # fmt: skip
    with pytest.raises(ValueError, match="cross_attention_layers must list layer indexes"):
        model_from_hf_config(
            {"model_type": "mllama", "text_config": text, "vision_config": {}}, name="bad"
        )


def test_qwen_smart_resize() -> None:
    """smart_resize of square images (factor 28, min 56^2, max 28^2 x 1280 pixels), worked by
    hand from image_processing_qwen2_vl.py: 448 -> 448 (16 x 16 tokens); 500 -> round(500/28)
    = 18 -> 504; 2000 -> 1988^2 > max: beta = 2000 / sqrt(1003520), floor(2000 / beta / 28) x 28
    = floor(35.78) x 28 = 980; 20 -> round(20/28) = 1 -> 28^2 < min: ceil(20 x sqrt(3136 / 400)
    / 28) x 28 = 56; 10 -> round(10/28) = 0 -> ceil(10 x 5.6 / 28) x 28 = 56."""
    sides = qwen_resized_side(
        np.array([448, 500, 2000, 20, 10]), factor=28, min_pixels=56 * 56,
        max_pixels=28 * 28 * 1280,
    )  # fmt: skip
    assert sides.tolist() == [448, 504, 980, 56, 56]
    q = load_model("qwen2.5-vl-7b").vision
    assert q is not None
    assert image_tokens_per_image(q, np.array([448.0])).tolist() == [256.0]  # (448/28)^2
    assert vision_sequence_per_image(q, np.array([448.0])).tolist() == [1024.0]  # (448/14)^2


def test_mllama_tiles_and_keys() -> None:
    v = load_model("llama-3.2-11b-vision").vision
    assert v is not None
    assert mllama_tiles(v, np.array([560.0, 1120.0, 4000.0])).tolist() == [1.0, 4.0, 4.0]
    # Every image is padded to 4 tiles of 1601 patches, padded to 1608 in the encoder.
    assert vision_sequence_per_image(v, np.array([560.0])).tolist() == [4 * 1608]
    assert cross_attention_keys_per_image(v) == 4 * 1601
    assert image_tokens_per_image(v, np.array([560.0])).tolist() == [0.0]


# ------------------------------------------------------------------------- memory

from trainmem.engine import estimate, make_grid  # noqa: E402
from trainmem.engine._vision_memory import frozen_vision_parameter_numel  # noqa: E402

_JOB = {"micro_batch_size": 1, "seq_len": 1024, "precision": "amp-bf16", "recompute": "none"}


def _one(model, **fields):
    out = estimate(model, make_grid({**_JOB, **fields}))
    return {k: float(v[0]) for k, v in out.items() if np.asarray(v).dtype.kind == "f"}


def test_text_only_vlm_equals_its_language_model_plus_the_tower_states() -> None:
    """No images: the activations are the language model's (the same sequence); the states
    hold the tower too (trainable: weights, gradients, AdamW's two fp32 states)."""
    q = load_model("qwen2.5-vl-7b")
    text = model_from_hf_config(
        {k: v for k, v in json.loads(
            (Path(__file__).parents[3] / "catalog" / "presets" / "qwen2.5-vl-7b.json").read_text()
        ).items() if k != "vision_config"} | {"model_type": "qwen2"},
        name="qwen2.5-vl-7b-text",
    )  # fmt: skip
    vlm, lm = _one(q), _one(text)
    assert vlm["activations_total"] == lm["activations_total"]
    tower = frozen_vision_parameter_numel(q)
    assert tower == 676_550_144  # PyTorch's model.visual (param_counts.json parts)
    # optimizer states: AdamW's two fp32 states per trainable element (allocator-rounded per
    # tensor: within 512 bytes x tensors).
    extra = vlm["optimizer_states"] - lm["optimizer_states"]
    assert abs(extra - 8.0 * tower) < 512 * 400


def test_images_grow_the_sequence_and_the_tower_saves_activations() -> None:
    q = load_model("qwen2.5-vl-7b")
    base = _one(q)
    two = _one(q, images_per_sample=2, image_size=448)
    frozen = _one(q, images_per_sample=2, image_size=448, freeze_vision=True)
    # More tokens in the language model, and the trained tower's own saved tensors on top.
    assert base["activations_total"] < frozen["activations_total"] < two["activations_total"]
    tower = frozen_vision_parameter_numel(q)
    assert abs((two["optimizer_states"] - frozen["optimizer_states"]) - 8.0 * tower) < 512 * 400
    assert frozen["gradients_total"] < two["gradients_total"]
    assert frozen["parameters"] == pytest.approx(two["parameters"], rel=1e-4)


def test_frozen_tower_text_activations_equal_a_longer_text_sequence() -> None:
    """A frozen tower saves nothing: the activations are the language model's on seq_len +
    image tokens (2 x 256)."""
    q = load_model("qwen2.5-vl-7b")
    frozen = _one(q, images_per_sample=2, image_size=448, freeze_vision=True)
    longer = _one(q, seq_len=1024 + 512, freeze_vision=True)
    assert frozen["activations_total"] == longer["activations_total"]


def test_mllama_cross_attention_keys_add_activations() -> None:
    ll = load_model("llama-3.2-11b-vision")
    base = _one(ll, freeze_vision=True)
    one = _one(ll, images_per_sample=1, image_size=560, freeze_vision=True)
    # Frozen tower: the 8 cross-attention blocks' k, v over 4 x 1601 keys (3 [keys, 1024]
    # tensors each) plus the projector's output [keys, 4096], bf16.
    keys = 4 * 1601
    want = 8 * 3 * keys * 1024 * 2 + keys * 4096 * 2
    assert one["activations_total"] - base["activations_total"] == pytest.approx(want, rel=1e-9)


def test_vlm_rows_of_a_grid_equal_single_rows() -> None:
    q = load_model("qwen2.5-vl-7b")
    grid = make_grid(
        {**_JOB, "images_per_sample": [0, 1, 4], "freeze_vision": [False, True, False]}
    )
    many = estimate(q, grid)
    for i, (n, f) in enumerate(((0, False), (1, True), (4, False))):
        one = _one(q, images_per_sample=n, freeze_vision=f)
        assert float(many["peak_allocated_bytes"][i]) == one["peak_allocated_bytes"]


def test_the_human_header_says_the_images(capsys) -> None:
    # The sequence the language model runs is seq_len + the images' tokens: the header names
    # the images beside the text length (and a frozen tower).
    from trainmem.cli import main

    argv = ["estimate", "--model", "qwen2.5-vl-7b", "--images-per-sample", "2"]
    argv += ["--image-size", "896", "--freeze-vision", "--num-gpus", "1", "--zero", "0"]
    assert main(argv) == 0
    header = capsys.readouterr().out.splitlines()[2]
    assert header.endswith("x seq 2048 + 2 images of 896 px a sequence, vision tower frozen")


# ---- LLaVA (CLIP tower) and Gemma 3 (SigLIP tower) ------------------------------------------

CONFIGS = Path(__file__).parents[2] / "data" / "configs"
LLAVA_15_7B_PYTORCH = 7_063_427_072
"""sum(p.numel() for p in model.parameters()) of LlavaForConditionalGeneration built on
torch.device("meta") from tests/data/configs/llava-1.5-7b/config.json (torch 2.13.0+cpu,
transformers 5.24.0): Vicuna-7B with 32,064 rows, CLIP ViT-L/14-336 303,507,456 (its last block
included), projector 20,979,712. The config.json is llava-hf/llava-1.5-7b-hf's as printed by
transformers loading snapshot 05ae2434cbb430be33edcba0c5203e7023f785b7 (a public training log),
text_config listing only what differs from LlamaConfig's defaults."""


def test_llava_config_reads_clip_and_counts_equal_pytorch() -> None:
    m = load_model(str(CONFIGS / "llava-1.5-7b"))
    assert m.num_parameters == LLAVA_15_7B_PYTORCH
    v = m.vision
    assert v is not None and v.kind == "llava" and v.class_token
    # LlamaConfig's defaults fill text_config: 4096 wide, 32 blocks, 32 heads
    assert (m.hidden_size, m.num_hidden_layers, m.num_attention_heads) == (4096, 32, 32)
    assert (v.num_layers, v.num_unused_layers, v.image_tokens) == (24, 1, 576)
    assert v.hidden_act == "quick_gelu" and v.vision_output_dim == 1024


def test_llava_image_tokens_follow_the_strategy_and_feature_layers() -> None:
    base = json.loads((CONFIGS / "llava-1.5-7b" / "config.json").read_text())
    full = model_from_hf_config({**base, "vision_feature_select_strategy": "full"}, name="x")
    assert full.vision is not None and full.vision.image_tokens == 577
    many = model_from_hf_config({**base, "vision_feature_layer": [-2, -5, 12]}, name="x")
    assert many.vision is not None
    assert (many.vision.num_unused_layers, many.vision.vision_output_dim) == (1, 3 * 1024)
    # the projector's first linear reads the concatenation: 2 more [1024, 4096] matrices
    m = load_model(str(CONFIGS / "llava-1.5-7b"))
    assert many.num_parameters - m.num_parameters == 2 * 1024 * 4096
    # every image is 576 tokens, whatever its size (the processor resizes to 336 pixels)
    grid = make_grid({"images_per_sample": 2, "image_size": [224, 1024], "seq_len": 512})
    out = estimate(m, grid)
    assert float(out["activations_total"][0]) == float(out["activations_total"][1])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"vision_feature_layer": 30}, "vision_feature_layer must be an index"),
        ({"vision_feature_select_strategy": "cls"}, "must be default or full"),
        ({"vision_config": {"model_type": "dinov2"}}, "vision_config.model_type must be one of"),
    ],
)
def test_bad_llava_fields_are_one_line_errors(change: dict, message: str) -> None:
    base = json.loads((CONFIGS / "llava-1.5-7b" / "config.json").read_text())
    with pytest.raises(ValueError, match=message) as err:
        model_from_hf_config({**base, **change}, name="llava.json")
    assert "\n" not in str(err.value) and "llava.json" in str(err.value)


def test_gemma3_tokens_per_image_must_pool_the_patch_grid() -> None:
    base = json.loads((CONFIGS / "gemma-3-4b" / "config.json").read_text())
    with pytest.raises(ValueError, match="mm_tokens_per_image must be a square"):
        model_from_hf_config({**base, "mm_tokens_per_image": 200}, name="g.json")
    m = model_from_hf_config({**base, "mm_tokens_per_image": 64}, name="g.json")
    assert m.vision is not None and m.vision.image_tokens == 64


def test_a_frozen_or_lora_tower_saves_nothing_and_trains_nothing() -> None:
    m = load_model(str(CONFIGS / "llava-1.5-7b"))
    grid = make_grid(
        {
            "images_per_sample": 1,
            "seq_len": 512,
            "precision": "amp-bf16",
            "freeze_vision": [False, True],
        }
    )
    out = estimate(m, grid)
    trained, frozen = (float(x) for x in out["activations_total"])
    assert trained > frozen
    # the tower's and projector's weights stay either way (fp32 here: amp), its gradients go
    tower = 303_507_456 + 20_979_712
    unused = 12_596_224  # the last CLIP block, which no gradient reaches when trained
    assert float(out["gradients_total"][0]) - float(out["gradients_total"][1]) == pytest.approx(
        4 * (tower - unused)
    )
    assert float(out["parameters"][0]) == float(out["parameters"][1])
