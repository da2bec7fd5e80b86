"""recommend --framework litgpt: a JSON plan within what LitGPT 0.5.13 launches; no launch format
renders LitGPT (its YAML is not one of them), each refuses it with one line."""

from __future__ import annotations

import pytest

import trainmem
from trainmem.plan import FORMATS, render

JOB = {"model": "llama-3.1-8b", "fleet": "8xh100", "seq_len": 2048, "global_batch_size": 16,
       "lora_rank": 16, "framework": "litgpt"}  # fmt: skip


@pytest.fixture(scope="module")
def report() -> dict:
    return trainmem.recommend(**JOB)


def test_plan_is_one_litgpt_launches(report) -> None:
    # finetune/lora.py: one device, or FSDP (fully_shard) over data parallel ranks only;
    # whole-Block checkpointing or none; no CPU offload; its default precision bf16-mixed.
    assert report["framework"] == "litgpt" and report["fits"]
    assert (report["tp"], report["pp"], report["cp"]) == (1, 1, 1)
    assert report["zero"] in (0, 3) and report["offload"] == "none"
    assert report["recompute"] in ("none", "full")
    assert report["precision"] == "amp-bf16"
    assert render(report, "json").startswith("{")


def test_launch_formats_refuse_litgpt(report) -> None:
    for fmt in FORMATS[1:]:
        with pytest.raises(ValueError, match=f"format {fmt} launches .*, not litgpt") as err:
            render(report, fmt)
        assert "\n" not in str(err.value)


def test_litgpt_precisions() -> None:
    # bf16-true is --precision bf16; a precision LitGPT has no flag for is refused.
    assert trainmem.recommend(**JOB, precision="bf16")["precision"] == "bf16"
    with pytest.raises(ValueError, match="allowed: amp-bf16, bf16, amp-fp16, fp16, fp32"):
        trainmem.recommend(**JOB, precision="fp8-mixed")
