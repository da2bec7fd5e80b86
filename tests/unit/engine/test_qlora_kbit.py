"""QLoRA as bitsandbytes + peft run it (FrameworkSpec.qlora_kbit_prepared; engine/_lora.py):
prepare_model_for_kbit_training's fp32 casts, Linear4bit's fp32 outputs under autocast, the
head's autocast copy. Figures from tests/data/framework_traces/hf_qlora.json (a 4-layer Llama,
h 512, f 1536, 8 heads / 2 kv heads, vocab 2048, 1 x 2048 tokens) and for Llama-3.1-8B."""

from __future__ import annotations

import numpy as np
import pytest

from tests.framework_accuracy import small_llama_spec
from trainmem.catalog import load_model
from trainmem.engine import estimate_one
from trainmem.engine._codes import AMP_BF16, BF16, FP16, FP32, MIXED_BF16
from trainmem.engine._frameworks import FRAMEWORK_SPECS, QLORA_KBIT_PREPARED
from trainmem.engine._lora import (
    kbit_activation_precision,
    kbit_prepared_base_bytes,
    kbit_pure_16,
    qlora_head_copy_bytes,
    qlora_kbit_activation_delta_bytes,
)
from trainmem.engine._vocab import FRAMEWORKS

TINY = small_llama_spec(
    {"hidden": 512, "intermediate": 1536, "heads": 8, "kv_heads": 2, "layers": 4, "vocab": 2048}
)
T = 2048.0


def test_the_stacks_that_prepare_the_model_for_kbit_training() -> None:
    # peft + bitsandbytes under the HF Trainer (alone or with DeepSpeed); torchtune's torchao
    # NF4 keeps the model's dtype; megatron and torchtitan have no QLoRA recipe; litgpt's
    # `--quantize bnb.nf4` swaps in Linear4bit through Fabric's BitsandbytesPrecision without
    # peft's preparation (the rest stays in the model dtype); verl's actor wraps the model with
    # peft's get_peft_model only (verl/workers/fsdp_workers.py), no 4-bit preparation.
    prepared = {name: bool(QLORA_KBIT_PREPARED[FRAMEWORKS.index(name)]) for name in FRAMEWORKS}
    assert prepared == {
        "hf": True,
        "megatron": False,
        "deepspeed": True,
        "torchtitan": False,
        "torchtune": False,
        "litgpt": False,
        "verl": False,
    }
    assert all(isinstance(s.qlora_kbit_prepared, bool) for s in FRAMEWORK_SPECS.values())


def test_block_delta_under_autocast_is_the_traced_one() -> None:
    # Traced per layer: QLoRA 68,697,088 B, peft LoRA on an fp32 base 51,919,872 B: +16,777,216
    # = 2 B x 3 x T f (gate, SiLU, up outputs fp32) - 2 B x T h (o_proj's bf16 input copy).
    one = np.array([True])
    got = qlora_kbit_activation_delta_bytes(TINY, T=T, tp=1.0, amp=one, o_adapted=one,
                                            prepared=one)  # fmt: skip
    assert got.tolist() == [68_697_088 - 51_919_872]
    unadapted_o = qlora_kbit_activation_delta_bytes(
        TINY, T=T, tp=1.0, amp=one, o_adapted=~one, prepared=one
    )
    assert unadapted_o.tolist() == [2 * 3 * 2048 * 1536]


@pytest.mark.parametrize(("amp", "prepared"), [(False, True), (True, False)])
def test_block_delta_is_zero_without_autocast_or_preparation(amp: bool, prepared: bool) -> None:
    got = qlora_kbit_activation_delta_bytes(
        TINY, T=T, tp=1.0, amp=np.array([amp]), o_adapted=np.array([True]),
        prepared=np.array([prepared]),
    )  # fmt: skip
    assert got.tolist() == [0.0]


def test_block_delta_for_llama_3_1_8b() -> None:
    # 2 x 3 x 2048 x 14336 - 2 x 2048 x 4096 = 159,383,552 B (152.0 MiB) per layer at 1 x 2048.
    m = load_model("llama-3.1-8b")
    one = np.array([True])
    got = qlora_kbit_activation_delta_bytes(m, T=T, tp=1.0, amp=one, o_adapted=one, prepared=one)
    assert got.tolist() == [159_383_552]


def test_head_copy() -> None:
    # The fp32 head's bf16 autocast copy: 2 x 2048 x 512 (traced), 2 x 128256 x 4096 (8B).
    one = np.array([True])
    assert qlora_head_copy_bytes(TINY, amp=one, qlora=one, last=one, tp=1.0).tolist() == [2_097_152]
    m = load_model("llama-3.1-8b")
    assert qlora_head_copy_bytes(m, amp=one, qlora=one, last=one, tp=1.0).tolist() == [
        1_050_673_152
    ]
    assert qlora_head_copy_bytes(m, amp=~one, qlora=one, last=one, tp=1.0).tolist() == [0.0]


def test_pure_16_bit_rows_run_as_fp32() -> None:
    prec = np.array([BF16, FP16, AMP_BF16, MIXED_BF16, FP32])
    yes = np.ones(5, dtype=bool)
    assert kbit_pure_16(prec, prepared=yes).tolist() == [True, True, False, False, False]
    assert kbit_activation_precision(prec, prepared=yes).tolist() == [
        FP32, FP32, AMP_BF16, MIXED_BF16, FP32
    ]  # fmt: skip
    assert kbit_activation_precision(prec, prepared=~yes).tolist() == prec.tolist()


def test_unquantised_rest_upcast() -> None:
    # base 10 B of which 6 B block linears, 2-byte elements: the 4 B rest doubles.
    base, linear = np.array([10.0, 10.0]), np.array([6.0, 6.0])
    got = kbit_prepared_base_bytes(
        base, linear, param_e=np.array([2.0, 2.0]), upcast=np.array([True, False])
    )
    assert got.tolist() == [14.0, 10.0]


def test_llama_3_1_8b_bf16_parameters_count_the_fp32_rest() -> None:
    # hf (prepared) minus torchtune (model dtype kept): the embeddings, head and norms counted
    # 2 bytes more each: 2 x (2 x 128256 x 4096 + (2 x 32 + 1) x 4096) = 2,101,878,784 B.
    fields = {"micro_batch_size": 1, "seq_len": 2048, "precision": "bf16", "lora_rank": 16,
              "qlora": True}  # fmt: skip
    m = load_model("llama-3.1-8b")
    hf = estimate_one(m, {**fields, "framework": "hf"})["parameters"]
    tune = estimate_one(m, {**fields, "framework": "torchtune"})["parameters"]
    adapters = 2.0 * 41_943_040  # adapters: torchtune's bf16 (2 B), hf's fp32 (4 B)
    assert float(hf - tune) == 2.0 * (2 * 128256 * 4096 + 65 * 4096) + adapters


def _sharded_qlora(**over):
    llama = load_model("llama-2-70b")
    cfg = {"num_gpus": 2, "micro_batch_size": 2, "global_batch_size": 8, "seq_len": 2048,
           "precision": "bf16", "framework": "hf", "recompute": "full", "lora_rank": 8,
           "lora_targets": "all-linear", "qlora": True, "attention": "flash", **over}  # fmt: skip
    return estimate_one(llama, cfg)


def test_sharded_qlora_is_not_prepared_for_kbit_training() -> None:
    # TRL (the way peft's FSDP / DeepSpeed QLoRA recipes run) never calls
    # prepare_model_for_kbit_training on sharded QLoRA: the residual stream stays bf16, so a
    # checkpointed block keeps its bf16 input, b s h x 2 bytes = 2 x 2048 x 8192 x 2; the
    # unsharded job (ZeRO-2) is prepared: the same input in fp32.
    sharded = _sharded_qlora(zero=3)
    prepared = _sharded_qlora(zero=2)
    assert sharded["activations_per_layer"] == 2 * 2048 * 8192 * 2
    assert prepared["activations_per_layer"] == 2 * 2048 * 8192 * 4
    assert bool(kbit_pure_16(BF16, prepared=True))  # the fp32 casts apply at ZeRO-2


def test_sharded_qlora_keeps_its_adapters_in_bf16() -> None:
    # TRL: get_peft_model(..., autocast_adapter_dtype=False) for sharded QLoRA (TRL 2026:
    # trainable parameters cast to bf16), so the adapters and their gradients are 2 bytes per
    # element, half of peft's default fp32 adapters (the ZeRO-2 job).
    sharded = _sharded_qlora(zero=3, num_gpus=1)
    prepared = _sharded_qlora(zero=2, num_gpus=1)
    assert sharded["gradients"] * 2 == pytest.approx(prepared["gradients"], rel=1e-9)


def test_peft_docs_fsdp_qlora_70b_on_two_24gb_gpus() -> None:
    # peft docs/source/accelerate/fsdp.md (018ca9d): Llama-2-70B QLoRA over FSDP on 2 x 24 GB
    # with CPU offloading, batch 2 x 2048, "the memory consumed per GPU is 19.6 GB" (35.6 GB
    # without offloading). 8%: the doc's figure is a device reading of unstated method (GB
    # read as GiB), and the fp32 residual stream a prepared model would have adds ~5 GiB of
    # checkpointed inputs, far outside it (tests/data/published: hf-peft-qlora-70b-*).
    from trainmem import estimate

    flags = {"model": "llama-2-70b", "num_gpus": 2, "zero": 3, "micro_batch_size": 2,
             "global_batch_size": 8, "seq_len": 2048, "precision": "bf16", "framework": "hf",
             "recompute": "full", "lora_rank": 8, "lora_targets": "all-linear", "qlora": True,
             "attention": "flash", "load": "meta-init", "headroom": 0.0}  # fmt: skip
    offloaded = estimate(gpu="rtx-3090-24gb", offload="optimizer+params", **flags)
    assert offloaded["fits"]
    assert offloaded["peak_device_bytes"] / 2**30 == pytest.approx(19.6, rel=0.08)
    resident = estimate(gpu="a100-sxm-80gb", **flags)
    assert resident["peak_device_bytes"] / 2**30 == pytest.approx(35.6, rel=0.08)
