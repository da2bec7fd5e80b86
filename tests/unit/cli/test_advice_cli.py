"""`estimate` advice: the changes that make a job fit agree with `estimate` on the changed job."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trainmem.cli import main

NOT_FITTING = [
    "estimate",
    "--model",
    "llama-3-8b",
    "--gpu",
    "h100-sxm-80gb",
    "--num-gpus",
    "1",
    "--zero",
    "0",
    "--seq-len",
    "8192",
    "--micro-batch-size",
    "4",
    "--recompute",
    "none",
    "--precision",
    "amp-bf16",
    "--optimizer",
    "adamw",
    "--json",
]
"""Llama-3-8B, seq 8192, micro-batch 4, no checkpointing, 1 x H100 SXM 80GB (issue 8)."""

ONE_GPU_JOB = ["--precision", "amp-bf16", "--recompute", "none", "--micro-batch-size", "1"]
ONE_GPU_JOB += ["--json"]
"""The fields the one-job defaults set (JOB_DEFAULTS) back at TrainingConfig's: a job that does
not fit on 8 GPUs with ZeRO-1."""

BOOL_FLAGS = ("sequence_parallel", "qlora", "activation_offload")


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _argv(base: list[str], changes: dict[str, Any], gpu: str) -> list[str]:
    """`base` with the changed fields' flags replaced (or added) and the GPU set."""
    flags: dict[str, list[str]] = {}
    key = ""
    for item in base[1:]:
        if item.startswith("--"):
            key = item
            flags[key] = []
        else:
            flags[key].append(item)
    flags["--gpu"] = [gpu]
    for field, value in changes.items():
        flag = "--" + field.replace("_", "-")
        if field in BOOL_FLAGS:
            if value:
                flags[flag] = []
            else:
                flags.pop(flag, None)
        else:
            flags[flag] = [str(value)]
    argv = [base[0]]
    for flag, values in flags.items():
        argv += [flag, *values]
    return argv


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(NOT_FITTING) == 0
    return json.loads(buf.getvalue())


def test_job_does_not_fit_and_advice_makes_it_fit(report: dict[str, Any]) -> None:
    assert not report["fits"]
    fitting = [a for a in report["advice"] if a["fits"]]
    assert fitting, "some change (or minimal set of changes) must make it fit"
    for a in report["advice"]:
        assert set(a) >= {"change", "saved_bytes", "fits", "step_time_ratio", "peak_device_bytes"}
        assert a["saved_bytes"] == report["peak_device_bytes"] - a["peak_device_bytes"]


def test_advice_ranked_fitting_first_then_least_slowdown(report: dict[str, Any]) -> None:
    fits = [a["fits"] for a in report["advice"]]
    assert fits == sorted(fits, reverse=True)
    ratios = [a["step_time_ratio"] for a in report["advice"] if a["fits"]]
    assert ratios == sorted(ratios)


def test_every_fitting_change_agrees_with_estimate(
    report: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    for a in [a for a in report["advice"] if a["fits"]]:
        again = _run(_argv(NOT_FITTING, a["changes"], a["gpu"]), capsys)
        assert again["peak_device_bytes"] == a["peak_device_bytes"], a["change"]
        assert again["fits"], a["change"]
        ratio = again["time"]["step_time_s"] / report["time"]["step_time_s"]
        assert ratio == pytest.approx(a["step_time_ratio"], rel=1e-9), a["change"]


def test_single_changes_agree_with_estimate(
    report: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    singles = [a for a in report["advice"] if "+" not in a["knob"]]
    assert {a["knob"] for a in singles} >= {
        "recompute",
        "micro_batch_size",
        "offload",
        "loss",
        "optimizer",
        "lora",
        "qlora",
        "gpu",
    }
    for a in singles:
        again = _run(_argv(NOT_FITTING, a["changes"], a["gpu"]), capsys)
        assert again["peak_device_bytes"] == a["peak_device_bytes"], a["change"]
        assert again["fits"] == a["fits"], a["change"]


def test_micro_batch_change_keeps_the_global_batch(report: dict[str, Any]) -> None:
    halves = [a for a in report["advice"] if a["knob"] == "micro_batch_size"]
    assert {a["config"]["micro_batch_size"] for a in halves} == {1, 2}
    assert all(a["config"]["global_batch_size"] == 4 for a in halves)


def test_top_consumers_name_the_loss_gradients(report: dict[str, Any]) -> None:
    words = [c["what"] for c in report["top_consumers"]]
    sizes = [c["bytes"] for c in report["top_consumers"]]
    assert sizes == sorted(sizes, reverse=True)
    loss = next(c for c in report["top_consumers"] if "loss gradients" in c["what"])
    assert "128,256-token vocabulary" in loss["what"]
    assert loss["bytes"] == 8 * 4 * 8192 * 128_256  # two fp32 [tokens, vocab] tensors
    assert any(w.startswith("optimizer states (adamw, 2 fp32 states") for w in words)
    assert sum(sizes) == pytest.approx(report["peak_device_bytes"], abs=16)


def test_multi_gpu_neighbours_include_zero_and_parallel_degrees(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["estimate", "--model", "llama-3.1-8b", "--num-gpus", "8", "--zero", "1", *ONE_GPU_JOB]
    out = _run(base, capsys)
    knobs = {a["knob"] for a in out["advice"]}
    assert {"zero", "tp", "pp", "cp"} <= knobs
    tp = next(a for a in out["advice"] if a["knob"] == "tp")
    assert tp["config"]["tp"] == 2 and tp["config"]["global_batch_size"] == 8
    again = _run(_argv(base, tp["changes"], tp["gpu"]), capsys)
    assert again["peak_device_bytes"] == tp["peak_device_bytes"]


def test_human_output_lists_changes_that_fit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(NOT_FITTING[:-1]) == 0
    text = capsys.readouterr().out
    assert "make it fit" in text or "together do" in text
    assert "top memory consumers at the peak:" in text


@pytest.mark.parametrize(
    ("precision", "framework", "zero", "rest"),
    [("amp-bf16", "hf", "0", "fp32"), ("bf16", "hf", "0", "fp32"),
     ("bf16", "torchtune", "0", "16-bit"), ("bf16", "hf", "3", "16-bit")],
)  # fmt: skip
def test_qlora_parameters_say_the_dtype_of_the_unquantised_rest(
    precision: str, framework: str, zero: str, rest: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # amp keeps the modules bitsandbytes leaves unquantised (embeddings, head, norms) in fp32:
    # the label said "16-bit rest" while the bytes counted them in fp32 (1.95 GiB more here).
    # hf's peft.prepare_model_for_kbit_training casts them to fp32 under bf16 too; torchtune
    # keeps its model dtype, and so does sharded QLoRA (ZeRO-3: TRL does not prepare it).
    argv = ["estimate", "--model", "llama-3-8b", "--gpu", "rtx-4090", "--lora-rank", "16"]
    argv += ["--framework", framework, "--zero", zero, "--num-gpus", "1" if zero == "0" else "2"]
    out = _run([*argv, "--qlora", "--precision", precision, "--json"], capsys)
    words = [c["what"] for c in out["top_consumers"] if c["what"].startswith("parameters")]
    assert words == [f"parameters (NF4 base weights, {rest} rest, 8.03B)"]
