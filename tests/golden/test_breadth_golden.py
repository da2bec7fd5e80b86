"""Golden figures of the engine-breadth issue (issue 3, "Done when"), through the CLI's JSON.

Parameter counts are exact integers (Mixtral-8x7B as PyTorch counts it; LoRA adapters as PEFT's
`print_trainable_parameters` counts them). Byte bounds are in GB = 10**9 bytes, as the issue
states them (not GiB).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from trainmem.catalog import load_model
from trainmem.cli import main

GB = 10**9
"""The issue's unit: 10**9 bytes (the CLI's human table uses GiB = 2**30)."""


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["estimate", *args, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


# ---- parameter counts ----------------------------------------------------------------------


def test_mixtral_8x7b_parameter_count(capsys) -> None:
    assert load_model("mixtral-8x7b").num_parameters == 46_702_792_704
    report = _json(capsys, "--model", "mixtral-8x7b")
    assert report["num_parameters"] == 46_702_792_704
    assert report["num_trainable_parameters"] == 46_702_792_704  # full fine-tuning


@pytest.mark.parametrize(
    ("model", "rank", "targets", "trainable"),
    [
        ("llama-3-8b", 16, "all-linear", 41_943_040),
        ("llama-3-8b", 16, "q_proj,v_proj", 6_815_744),
        ("mistral-7b", 16, "all-linear", 41_943_040),
        ("llama-2-7b", 8, "q_proj,v_proj", 4_194_304),
    ],
)
def test_lora_num_trainable_parameters_as_peft_counts(
    capsys, model: str, rank: int, targets: str, trainable: int
) -> None:
    report = _json(capsys, "--model", model, "--lora-rank", str(rank), "--lora-targets", targets)
    assert report["num_trainable_parameters"] == trainable
    assert report["num_parameters"] == load_model(model).num_parameters  # the base, unchanged


# ---- QLoRA on one consumer card ------------------------------------------------------------


def test_qlora_llama3_8b_fits_an_rtx_4090(capsys) -> None:
    report = _json(
        capsys,
        "--model", "llama-3-8b",
        "--seq-len", "2048",
        "--micro-batch-size", "2",
        "--recompute", "full",
        "--precision", "bf16",
        "--lora-rank", "16",
        "--qlora",
        "--optimizer", "adamw-8bit",
        "--gpu", "rtx-4090-24gb",
        "--num-gpus", "1",
        "--zero", "0",
    )  # fmt: skip
    assert report["fits"] is True
    # NF4 linear weights (+ absmax constants, 3.7 GB) and the embeddings, head and norms that
    # peft's prepare_model_for_kbit_training casts to fp32 (4.2 GB; 2.1 GB in bf16): 7.5 to 8.5.
    assert 7.5 * GB <= report["bytes"]["parameters"] <= 8.5 * GB
    assert report["bytes"]["master_weights"] == 0
    assert report["num_trainable_parameters"] == 41_943_040
    assert report["peak_device_bytes"] < report["gpu"]["usable_bytes"]


# ---- optimizer offload ---------------------------------------------------------------------


def test_offload_optimizer_moves_master_and_adam_states_to_the_host(capsys) -> None:
    common = [
        "--model", "llama-2-7b",
        "--num-gpus", "8",
        "--zero", "2",
        "--precision", "mixed-bf16",
        "--framework", "deepspeed",
    ]  # fmt: skip
    on_gpu = _json(capsys, *common)
    offloaded = _json(capsys, *common, "--offload", "optimizer")
    assert on_gpu["bytes"]["optimizer_states"] > 0 and on_gpu["host_bytes"] == 0
    for view in ("bytes", "breakdown_at_peak"):
        assert offloaded[view]["optimizer_states"] == 0
        assert offloaded[view]["master_weights"] == 0
    # fp32 master (4 B) + Adam exp_avg and exp_avg_sq (4 + 4 B) per parameter, ZeRO-partitioned.
    dp = offloaded["details"]["dp"]
    assert dp == 8
    assert offloaded["host_bytes"] >= 12 * offloaded["num_parameters"] / dp
    assert offloaded["peak_device_bytes"] < on_gpu["peak_device_bytes"]


# ---- expert parallelism --------------------------------------------------------------------


def test_ep8_divides_mixtral_expert_weights_by_8(capsys) -> None:
    common = ["--model", "mixtral-8x7b", "--num-gpus", "8", "--zero", "0", "--precision", "bf16"]
    ep1 = _json(capsys, *common, "--ep", "1")["bytes"]["parameters"]
    ep8 = _json(capsys, *common, "--ep", "8")["bytes"]["parameters"]
    m = load_model("mixtral-8x7b")

    def bf16_bytes(expert: bool) -> int:
        # Each tensor rounded to the allocator's 512-byte block, as the engine counts it.
        return sum(
            int(np.ceil(2 * p.numel / 512)) * 512 * m.group_count(p.group)
            for p in m.param_tensors()
            if p.expert == expert
        )

    experts = bf16_bytes(True)
    rest = bf16_bytes(False)
    assert experts % 8 == 0
    assert ep1 == rest + experts
    assert ep8 == rest + experts // 8  # the routed experts divided by 8, the rest unchanged
    assert ep1 - ep8 == experts * 7 // 8


# ---- contract ------------------------------------------------------------------------------


def test_new_json_keys_without_the_new_flags(capsys) -> None:
    report = _json(capsys, "--model", "llama-3.2-1b")
    assert report["host_bytes"] == 0
    assert report["num_trainable_parameters"] == report["num_parameters"]
    for flag in ("ep", "offload", "lora_rank", "lora_targets", "qlora", "loss"):
        assert flag in report["config"]
    assert report["config"]["activation_offload"] is False


@pytest.mark.parametrize(
    "args",
    [
        ["--qlora"],  # needs --lora-rank
        ["--offload", "optimizer", "--zero", "0"],  # needs --zero >= 1
        ["--loss", "fused"],
        ["--lora-targets", "qkvz", "--lora-rank", "8"],  # not a target name
        ["--lora-targets", "qkv", "--lora-rank", "8"],  # a VLM tower's: none of Llama's
        ["--precision", "fp8"],
    ],
)
def test_bad_breadth_flags_exit_2_with_one_line(capsys, args: list[str]) -> None:
    assert main(["estimate", "--model", "llama-3.2-1b", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
