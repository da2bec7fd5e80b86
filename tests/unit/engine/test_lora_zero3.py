"""LoRA under Hugging Face FSDP2 (ZeRO-3) with mixed precision: FSDP2's param_dtype casts the
fp32 adapters to bf16 with the rest, so peft keeps no fp32 copy of an adapted input (traced in
bench/conformance.py's LoRA cells on 8 ranks: counted in fp32 they were +2.2% to +9.2%). The
key that carries it (lora_zero3) is False on every row without LoRA: no extra activation keys in
a sweep."""

from __future__ import annotations

import numpy as np

from trainmem.catalog import load_model
from trainmem.engine import estimate, estimate_one, make_grid

BASE = {"num_gpus": 8, "seq_len": 1024, "precision": "mixed-bf16", "framework": "hf"}


def _acts(**fields) -> float:
    grid = make_grid(**{**BASE, **fields})
    return float(estimate(load_model("llama-3.2-1b"), grid)["activations_total"][0])


def test_adapters_are_16_bit_under_fsdp2_mixed_precision_only() -> None:
    m, T, h, rank = load_model("llama-3.2-1b"), 1024, 2048, 8
    zero2, zero3 = _acts(zero=2, lora_rank=rank), _acts(zero=3, lora_rank=rank)
    # all-linear: per layer the fp32 copies of the adapted inputs (4 bytes per element, at most
    # one per adapted linear: widths h x 6 and f) go, and lora_A's [T, r] outputs are 2 bytes
    # instead of 4; what the base no longer saves is kept by lora_A in bf16 instead
    assert zero3 < zero2
    per_layer = (zero2 - zero3) / m.num_hidden_layers
    assert 4.0 * T * h < per_layer <= 4.0 * T * (6 * h + m.intermediate_size) + 7 * 2.0 * T * rank
    # no LoRA: the ZeRO stage does not change the activations
    assert _acts(zero=3) == _acts(zero=2)
    # amp (fp32 parameters all-gathered in fp32) and DeepSpeed are unchanged
    assert _acts(zero=3, lora_rank=rank, precision="amp-bf16") == _acts(
        zero=2, lora_rank=rank, precision="amp-bf16"
    )


def test_the_scalar_path_agrees() -> None:
    m = load_model("llama-3.2-1b")
    for zero in (2, 3):
        row = {**BASE, "zero": zero, "lora_rank": 8}
        one = estimate_one(m, row)
        assert one["activations_total"] == float(
            estimate(m, make_grid(**row))["activations_total"][0]
        )
    assert np.isfinite(one["peak_device_bytes"])
