"""LoRA on a vision-language model's tower and projector (engine/_vision_lora.py).

PEFT's all-linear takes every nn.Linear but the output head, the tower's and projector's too; a
listed name adapts every module whose name ends with it; lora_scope language (LLaMA-Factory's)
and freeze_vision adapt none of the tower's. The counts against peft's own on tiny configs are in
tests/unit/trace/test_vlm_trace.py (test_lora_trainable_parameters_equal_peft, which needs torch
and peft); here the presets' golden counts and the laws between scopes. Exact: integers, and
bytes that are integer multiples of them.
"""

from __future__ import annotations

import numpy as np
import pytest

from trainmem.catalog import load_model
from trainmem.engine import estimate, lora_mask, lora_num_parameters, make_grid
from trainmem.engine._lora import LORA_ALL_LINEAR_BIT, LORA_TARGETS, lora_module_bit
from trainmem.engine._vision_lora import tower_adapter_numel

JOB = {
    "micro_batch_size": 1,
    "seq_len": 512,
    "images_per_sample": 2,
    "image_size": 448,
    "precision": "amp-bf16",
    "lora_rank": 16,
}


def test_the_target_mask_keeps_all_linear_and_the_names_apart() -> None:
    """all-linear's bit and each listed name's literal bit beside the canonical ones: fc1 is
    up_proj to a language model and fc1 to a CLIP tower; out_proj adapts no language-model
    linear."""
    canonical = (1 << len(LORA_TARGETS)) - 1
    assert lora_mask("all-linear") == canonical | LORA_ALL_LINEAR_BIT
    assert lora_mask("fc1") == (1 << LORA_TARGETS.index("up_proj")) | lora_module_bit("fc1")
    assert lora_mask("out_proj") & canonical == 0
    assert lora_mask("q_proj,v_proj") == lora_mask("q_proj") | lora_mask("v_proj")
    with pytest.raises(ValueError, match="unknown target 'qkvx'"):
        lora_mask("qkvx")


PRESET_ADAPTERS = [
    # preset, targets, adapters at r = 16 (language model + tower + projector; PEFT's count),
    # auto and language scope
    ("qwen2.5-vl-7b", "all-linear", 51_824_640, 40_370_176),
    ("qwen2.5-vl-7b", "q_proj,v_proj", 5_046_272, 5_046_272),  # Qwen's fused qkv: not q_proj
    ("llava-1.5-7b", "all-linear", 47_267_840, 39_976_960),
    ("llava-1.5-7b", "q_proj,v_proj", 9_961_472, 8_388_608),
    ("llama-3.2-11b-vision", "all-linear", 67_362_816, 52_428_800),
    ("llama-3.2-11b-vision", "q_proj,v_proj", 11_796_480, 8_519_680),
]


@pytest.mark.parametrize(("preset", "targets", "auto", "language"), PRESET_ADAPTERS)
def test_preset_adapters_and_their_gradients(
    preset: str, targets: str, auto: int, language: int
) -> None:
    """The trainable count per scope (as the tiny configs' against peft), and the estimate's
    fp32 gradients of exactly those a gradient reaches (LLaVA's last CLIP block, after its
    feature layer -2, holds its adapters without one)."""
    m = load_model(preset)
    mask = lora_mask(targets)
    assert lora_num_parameters(m, 16, mask) == auto
    assert lora_num_parameters(m, 16, mask, lora_scope="language") == language
    assert lora_num_parameters(m, 16, mask, freeze_vision=True) == language
    grid = make_grid({**JOB, "lora_targets": targets, "lora_scope": ["auto", "language"]})
    out = estimate(m, grid)
    assert m.vision is not None
    _, unreached = tower_adapter_numel(m.vision, {**grid, "lora_targets": np.full(2, mask)})
    assert out["gradients_total"][0] == 4.0 * (auto - unreached[0])
    assert out["gradients_total"][1] == 4.0 * language
    assert out["optimizer_states"][0] - out["optimizer_states"][1] == pytest.approx(
        8.0 * (auto - unreached[0] - language), abs=64.0
    )  # AdamW's two fp32 states; the step scalars of the extra tensors beside them


def test_language_scope_is_the_frozen_tower_under_lora() -> None:
    """lora_scope language and freeze_vision give one estimate under LoRA: the base is frozen
    either way, and neither adapts nor saves anything in the tower."""
    m = load_model("llava-1.5-7b")
    language = estimate(m, make_grid({**JOB, "lora_scope": "language"}))
    frozen = estimate(m, make_grid({**JOB, "freeze_vision": True}))
    for key in ("parameters", "gradients_total", "optimizer_states", "activations_total"):
        assert language[key][0] == frozen[key][0], key


def test_an_adapted_tower_saves_its_blocks_and_an_unadapted_one_nothing() -> None:
    """all-linear: the tower's blocks save for backward; Qwen2.5-VL under q_proj,v_proj: no
    tower linear is adapted (its attention is one fused qkv), so it saves what the language
    scope's does; LLaVA's CLIP under q_proj,v_proj: adapted, so it saves."""
    qwen, llava = load_model("qwen2.5-vl-7b"), load_model("llava-1.5-7b")
    scopes = {"lora_scope": ["auto", "language"]}
    q_all = estimate(qwen, make_grid({**JOB, **scopes}))["activations_total"]
    assert q_all[0] > q_all[1]
    q_qv = estimate(qwen, make_grid({**JOB, **scopes, "lora_targets": "q_proj,v_proj"}))
    assert q_qv["activations_total"][0] == q_qv["activations_total"][1]
    l_qv = estimate(llava, make_grid({**JOB, **scopes, "lora_targets": "q_proj,v_proj"}))
    assert l_qv["activations_total"][0] > l_qv["activations_total"][1]
