"""`trainmem trace --lora-rank/--lora-targets/--qlora` (trace/_lora.py): flags and messages.

The refusals need neither torch nor peft; the traced step (skipped without torch, peft or the
fake CUDA device) checks the adapters: fp32 on a bf16 base, trainable, the base frozen."""

from __future__ import annotations

import pytest

from trainmem.trace._lora import QLORA_REFUSAL, check_lora, target_modules


def test_qlora_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="qlora: the trace cannot run QLoRA") as info:
        check_lora(lora_rank=8, lora_targets="all-linear", qlora=True)
    assert "\n" not in str(info.value) and str(info.value) == QLORA_REFUSAL


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lora_rank": -1, "lora_targets": "all-linear"}, "lora-rank: must be >= 0"),
        ({"lora_rank": 8, "lora_targets": " , "}, "lora-targets: name at least one"),
        ({"lora_rank": 8, "lora_targets": "all-linear", "tp": 2}, "not with --tp"),
    ],
)
def test_bad_lora_flags_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_lora(qlora=False, **kwargs)


def test_targets_map_to_peft() -> None:
    assert target_modules("all-linear") == "all-linear"
    assert target_modules("q_proj, v_proj") == ["q_proj", "v_proj"]


def test_cli_refuses_qlora_in_one_line() -> None:
    from trainmem.cli import main

    assert main(["trace", "--model", "llama-3.2-1b", "--lora-rank", "8", "--qlora"]) == 2


def test_lora_step_keeps_fp32_adapters_on_a_frozen_bf16_base() -> None:
    pytest.importorskip("torch", reason="trainmem[trace] not installed")
    pytest.importorskip("transformers", reason="trainmem[trace] not installed")
    pytest.importorskip("peft", reason="peft not installed: the LoRA trace needs it")
    from tests.conformance_families import family_config
    from trainmem.trace._core import trace_step
    from trainmem.trace._fake_cuda import fake_cuda_unavailable_reason

    if fake_cuda_unavailable_reason():
        pytest.skip(f"no fake CUDA device here: {fake_cuda_unavailable_reason()}")
    out = trace_step(
        family_config("llama"),
        micro_batch_size=1,
        seq_len=64,
        precision="bf16",
        recompute="none",
        attention="flash",
        optimizer="adamw",
        lora_rank=8,
        lora_targets="q_proj,v_proj",
    )
    # 2 layers x r 8 x (q: 256 + 256, v: 256 + 128)
    assert out["trainable_parameters"] == 2 * 8 * (512 + 384)
    assert out["gradients_bytes"] == 4 * out["trainable_parameters"]  # fp32 adapters
    assert out["optimizer_states_bytes"] == 2 * out["gradients_bytes"]
