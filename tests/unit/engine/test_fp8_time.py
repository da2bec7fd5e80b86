"""fp8-mixed in the step time (engine/_time.py _gemm_s, fp8_cast_bytes): the block GEMMs at the
GPU's fp8 rate, the head at the 16-bit one, the dynamic casts as HBM traffic. Issue "what a
user meets": `--precision fp8-mixed` on 8 x H100 used to change nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from trainmem.catalog import load_model
from trainmem.cli import app
from trainmem.engine import TimeParams, estimate_time, make_grid, time_inputs
from trainmem.engine._flops import block_linear_widths, matmul_parameters
from trainmem.hardware import get_gpu

H100 = time_inputs(get_gpu("h100-sxm-80gb"))
LLAMA = load_model("llama-3.1-8b")
JOB = dict(
    num_gpus=8, zero=3, micro_batch_size=2, seq_len=8192, recompute="none",
    framework="torchtitan",
)  # fmt: skip
"""No recompute: every GEMM weight then does the same FLOPs per token (2 forward, 4 backward)
and each cast happens once, so the expected values below are plain products."""


def _time(precision: str, **gpu: float) -> dict[str, float]:
    out = estimate_time(LLAMA, make_grid({**JOB, "precision": precision}), **{**H100, **gpu})
    return {k: float(v[0]) for k, v in out.items()}


def test_time_inputs_carry_the_fp8_rate() -> None:
    assert H100["fp8_peak_flops"] == get_gpu("h100-sxm-80gb").fp8_flops > H100["peak_flops"]
    assert time_inputs(get_gpu("a100-sxm-80gb"))["fp8_peak_flops"] == 0.0


def test_fp8_runs_the_block_gemms_at_the_fp8_rate() -> None:
    bf16, fp8 = _time("mixed-bf16"), _time("fp8-mixed")
    pr = TimeParams()
    blocks, head = matmul_parameters(LLAMA)
    # GEMM FLOPs split by the weights they touch (6 per weight and token, head and blocks
    # alike without recompute): each share at its own rate
    head_share = head / (blocks + head)
    gemm_bf16 = bf16["gemm_time_s"]
    expected = gemm_bf16 * head_share + gemm_bf16 * (1 - head_share) * (
        H100["peak_flops"] / (H100["fp8_peak_flops"] * pr.fp8_gemm_efficiency_ratio)
    )
    assert fp8["gemm_time_s"] == pytest.approx(expected, rel=1e-9)
    assert fp8["step_time_s"] < bf16["step_time_s"]
    assert fp8["tokens_per_second"] > 1.05 * bf16["tokens_per_second"]


def test_the_casts_cost_hbm_traffic() -> None:
    bf16, fp8 = _time("mixed-bf16"), _time("fp8-mixed")
    pr = TimeParams()
    tokens_per_gpu = 2 * 8192  # micro-batch x seq on each of 8 data-parallel ranks
    per_token = pr.fp8_cast_bytes_per_element * block_linear_widths(LLAMA) * 2.0
    weights = pr.fp8_cast_bytes_per_element * matmul_parameters(LLAMA)[0] * 2.0
    hbm = H100["hbm_bytes_per_s"] * pr.memory_bandwidth_efficiency
    extra = (tokens_per_gpu * per_token + weights) / hbm
    assert fp8["memory_bound_time_s"] - bf16["memory_bound_time_s"] == pytest.approx(
        extra, rel=1e-9
    )


def test_without_an_fp8_rate_the_gemms_run_at_the_16_bit_rate() -> None:
    assert _time("fp8-mixed", fp8_peak_flops=0.0)["gemm_time_s"] == pytest.approx(
        _time("mixed-bf16")["gemm_time_s"], rel=1e-12
    )


def test_other_precisions_ignore_the_fp8_rate() -> None:
    for precision in ("mixed-bf16", "bf16", "fp32", "amp-bf16"):
        a = _time(precision)
        b = _time(precision, fp8_peak_flops=0.0)
        assert a == b, precision


def test_a_moe_counts_the_experts_a_token_visits() -> None:
    m = load_model("mixtral-8x7b")
    widths = block_linear_widths(m)
    h, f = m.hidden_size, m.moe_intermediate_size or m.intermediate_size
    expert = 3 * (h + f) * m.num_experts_per_tok  # gate, up, down of the top-k experts
    assert widths > expert * m.num_hidden_layers
    assert np.isfinite(widths)


def test_the_cli_answers_fp8_with_a_faster_step_and_says_what_it_keeps() -> None:
    args = [
        "estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8",
        "--zero", "3", "--framework", "torchtitan", "--micro-batch-size", "2",
        "--seq-len", "8192", "--recompute", "selective",
    ]  # fmt: skip
    runner = CliRunner()
    bf16 = json.loads(runner.invoke(app, [*args, "--precision", "mixed-bf16", "--json"]).stdout)
    fp8 = json.loads(runner.invoke(app, [*args, "--precision", "fp8-mixed", "--json"]).stdout)
    assert fp8["time"]["step_time_s"] < bf16["time"]["step_time_s"]
    text = runner.invoke(app, [*args, "--precision", "fp8-mixed"]).stdout
    assert "fp8: the block GEMMs at the GPU's fp8 rate" in text
    assert "torchao Float8Linear saves the high-precision input" in text
