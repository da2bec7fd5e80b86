"""Laws of the step-time model (engine/_time.py): parts sum to the step, the bubble formula,
recomputation cost, scaling, one row equals the vectorized call, cost arithmetic, overrides."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainmem.catalog import load_model, preset_names
from trainmem.engine import (
    ATTENTION,
    FRAMEWORKS,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    TimeParams,
    bubble_fraction,
    estimate_time,
    make_grid,
    model_flops_per_token,
    time_inputs,
)
from trainmem.hardware import get_gpu

LAWS = settings(suppress_health_check=[HealthCheck.too_slow])
"""The profile (tests/conftest.py) sets the examples, seed, deadline and database; each example
builds whole grids, so too_slow is no failure."""
SUM_RTOL = 1e-12
"""The parts are float64 sums of the same terms: only rounding separates them."""

H100 = time_inputs(get_gpu("h100-sxm-80gb"))
A100 = time_inputs(get_gpu("a100-sxm-80gb"))
LLAMA = load_model("llama-3.1-8b")
PARTS = ("compute_time_s", "communication_exposed_s", "bubble_time_s")
COMM_PARTS = (
    "tp_exposed_s",
    "cp_exposed_s",
    "pp_p2p_s",
    "dp_exposed_s",
    "fsdp_exposed_s",
    "offload_s",
    "expert_s",
)
COMPUTE_PARTS = ("gemm_time_s", "attention_time_s", "memory_bound_time_s", "optimizer_time_s")


def _divisors(n: int, choices: tuple[int, ...]) -> list[int]:
    return [c for c in choices if n % c == 0]


@st.composite
def _rows(draw: st.DrawFn) -> tuple[Any, dict[str, Any]]:
    """A preset and one valid configuration of it."""
    m = load_model(draw(st.sampled_from(preset_names())))
    kv = m.num_key_value_heads
    tps = [
        t for t in _divisors(m.num_attention_heads, (1, 2, 4, 8, 16)) if kv % t == 0 or t % kv == 0
    ]
    tp = draw(st.sampled_from(tps))
    pp = draw(st.sampled_from(_divisors(m.num_hidden_layers, (1, 2, 4))))
    cp = draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2, 4, 16]))
    mbs = draw(st.integers(1, 8))
    num_micro = draw(st.sampled_from([1, 2, 8]))
    row = {
        "micro_batch_size": mbs,
        "seq_len": draw(st.sampled_from([512, 2048, 8192])),
        "num_gpus": tp * pp * cp * dp,
        "global_batch_size": num_micro * mbs * dp,
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "virtual_stages": draw(st.sampled_from(_divisors(m.num_hidden_layers // pp, (1, 2))))
        if pp > 1
        else 1,
        "sequence_parallel": draw(st.booleans()),
        "precision": draw(st.sampled_from(PRECISIONS)),
        "optimizer": draw(st.sampled_from(OPTIMIZERS)),
        "recompute": draw(st.sampled_from(RECOMPUTE)),
        "attention": draw(st.sampled_from(ATTENTION)),
        "framework": draw(st.sampled_from(FRAMEWORKS)),
    }
    zero = draw(st.integers(0, 3))
    offloads = (
        ["none"] + (["optimizer"] if zero >= 1 else []) + (["optimizer+params"] * (zero == 3))
    )
    eps = [
        e
        for e in (1, 2, 4)
        if (dp * cp) % e == 0 and (e == 1 or (m.is_moe and m.num_experts % e == 0))
    ]
    rank = draw(st.sampled_from([0, 0, 8]))
    row |= {
        "zero": zero,
        "offload": draw(st.sampled_from(offloads)),
        "ep": draw(st.sampled_from(eps)),
        "lora_rank": rank,
        "qlora": rank > 0 and draw(st.booleans()),
    }
    return m, row


def _one(m: Any, gpu: dict[str, float] = H100, **row: Any) -> dict[str, float]:
    out = estimate_time(m, make_grid(**row), **gpu)
    return {k: float(v[0]) for k, v in out.items()}


@LAWS
@given(_rows(), st.sampled_from([H100, A100]))
def test_parts_are_nonnegative_and_sum_to_the_step(case: tuple, gpu: dict[str, float]) -> None:
    m, row = case
    out = _one(m, gpu, **row)
    for key in (*PARTS, *COMM_PARTS, *COMPUTE_PARTS):
        assert out[key] >= 0.0, (key, out[key], row)
    step = out["step_time_s"]
    assert sum(out[k] for k in PARTS) == pytest.approx(step, rel=SUM_RTOL)
    assert sum(out[k] for k in COMM_PARTS) == pytest.approx(
        out["communication_exposed_s"], rel=SUM_RTOL
    )
    assert sum(out[k] for k in COMPUTE_PARTS) == pytest.approx(out["compute_time_s"], rel=SUM_RTOL)
    assert 0.0 < out["mfu"] <= out["hfu"] <= 1.0, row


@LAWS
@given(_rows())
def test_a_row_of_the_vectorized_call_equals_the_single_call(case: tuple) -> None:
    m, row = case
    others = [
        {**row, "micro_batch_size": 1, "global_batch_size": 0},
        {**row, "recompute": "full", "precision": "fp32"},
        row,
    ]
    grid = make_grid({k: [r[k] for r in others] for k in row})
    gpus = [H100, A100, H100]
    per_row = {k: np.array([g[k] for g in gpus]) for k in H100}  # GPU values as columns
    out = estimate_time(m, grid, **per_row, tokens=1e12)
    for i, r in enumerate(others):
        single = estimate_time(m, make_grid(**r), **gpus[i], tokens=1e12)
        for key, column in out.items():
            assert column[i] == pytest.approx(float(single[key][0]), rel=1e-12), (key, r)


@pytest.mark.parametrize(
    ("pp", "num_micro", "v"), [(2, 1, 1), (4, 8, 1), (4, 8, 2), (8, 16, 5), (16, 64, 5)]
)
def test_bubble_is_narayanan_formula_exactly(pp: int, num_micro: int, v: int) -> None:
    """bubble / (bubble + pipelined work) = (p-1)/(m v + p - 1), Narayanan et al. 2021 Sec. 2.2."""
    out = _one(
        load_model("llama-2-70b"),
        num_gpus=pp,
        pp=pp,
        virtual_stages=v,
        micro_batch_size=1,
        global_batch_size=num_micro,
    )
    outside_pipeline = out["optimizer_time_s"] + out["dp_exposed_s"] + out["fsdp_exposed_s"]
    pipelined = out["step_time_s"] - out["bubble_time_s"] - outside_pipeline
    expected = (pp - 1) / (num_micro * v + pp - 1)
    assert out["bubble_time_s"] / (out["bubble_time_s"] + pipelined) == pytest.approx(
        expected, rel=1e-12
    )
    assert float(bubble_fraction(pp, num_micro, v)) == pytest.approx(expected, rel=1e-15)


def test_full_recompute_costs_about_a_third_more_compute() -> None:
    """An extra forward (2N of 6N per token) on the blocks: compute x ~4/3, less for the head
    and the optimizer step, which are not recomputed."""
    row = {"num_gpus": 8, "zero": 3, "micro_batch_size": 4, "seq_len": 4096}
    none, sel, full = (_one(LLAMA, **row, recompute=r) for r in ("none", "selective", "full"))
    ratio = (full["compute_time_s"] - full["optimizer_time_s"]) / (
        none["compute_time_s"] - none["optimizer_time_s"]
    )
    assert 1.25 < ratio <= 4.0 / 3.0 + 1e-12
    assert full["hardware_flops_per_step"] / none["hardware_flops_per_step"] < 4.0 / 3.0
    assert none["step_time_s"] < sel["step_time_s"] < full["step_time_s"]
    assert none["mfu"] > sel["mfu"] > full["mfu"]  # MFU does not count recomputation
    assert full["hfu"] > full["mfu"]


def test_recompute_policies_order_their_compute() -> None:
    """Per-op SAC runs the unsaved matmuls again (k, o, up: about a third of a Llama block's
    matmul FLOPs) and no attention; every-other-block checkpointing half the blocks' forward."""
    row = {"num_gpus": 8, "zero": 3, "micro_batch_size": 4, "seq_len": 4096}
    flops = {
        r: _one(LLAMA, **row, recompute=r, recompute_every=2)["hardware_flops_per_step"]
        for r in RECOMPUTE
    }
    assert flops["none"] < flops["selective"] < flops["full"]
    assert flops["none"] < flops["selective-op"] < flops["selective-layer"] < flops["full"]


@pytest.mark.parametrize("zero", [0, 3])
def test_more_gpus_same_work_per_gpu_more_tokens_per_second(zero: int) -> None:
    """Weak scaling over data parallelism: the job's tokens/s grows, per GPU it cannot."""
    results = [
        _one(LLAMA, num_gpus=n, zero=zero, micro_batch_size=2, seq_len=4096, recompute="full")
        for n in (8, 16, 64, 512)
    ]
    tps = [r["tokens_per_second"] for r in results]
    per_gpu = [r["tokens_per_second_per_gpu"] for r in results]
    assert all(a < b for a, b in zip(tps, tps[1:], strict=False)), tps
    assert all(a >= b for a, b in zip(per_gpu, per_gpu[1:], strict=False)), per_gpu


def test_tensor_parallel_across_nodes_is_slower_than_within() -> None:
    row = {"num_gpus": 16, "tp": 16, "micro_batch_size": 1, "seq_len": 4096}
    m = load_model("llama-2-70b")
    within = _one(m, {**H100, "gpus_per_node": 16.0}, **row)
    across = _one(m, H100, **row)
    assert across["tp_exposed_s"] > 5 * within["tp_exposed_s"] > 0.0
    assert across["step_time_s"] > within["step_time_s"]


def test_model_flops_are_palm_6n_plus_attention() -> None:
    """6 x (parameters less the embedding and norms) + 12 L s h for Llama (PaLM Appendix B),
    as torchtitan's get_nparams_and_flops counts them (norms are 0.003% of it)."""
    m, s = LLAMA, 8192
    embedding = m.vocab_size * m.hidden_size
    expected = 6 * (m.num_parameters - embedding) + 12 * m.num_hidden_layers * s * m.hidden_size
    assert float(model_flops_per_token(m, s)) == pytest.approx(expected, rel=1e-4)


def test_cost_and_budget_arithmetic() -> None:
    gpu = {**H100, "price_per_gpu_hour_usd": 2.0}
    out = _one(LLAMA, gpu, num_gpus=8, zero=3, micro_batch_size=2)
    per_million = 8 * 2.0 / 3600.0 / out["tokens_per_second"] * 1e6
    assert out["cost_per_million_tokens"] == pytest.approx(per_million, rel=1e-12)
    budget = estimate_time(
        LLAMA, make_grid(num_gpus=8, zero=3, micro_batch_size=2), **gpu, tokens=2e9
    )
    assert float(budget["time_to_train_s"][0]) == pytest.approx(
        2e9 / out["tokens_per_second"], rel=1e-12
    )
    assert float(budget["cost_to_train_usd"][0]) == pytest.approx(2e3 * per_million, rel=1e-12)
    twice = _one(LLAMA, {**gpu, "price_per_gpu_hour_usd": 4.0}, num_gpus=8, zero=3)
    assert twice["step_time_s"] == pytest.approx(
        _one(LLAMA, gpu, num_gpus=8, zero=3)["step_time_s"]
    )


def test_fp32_runs_at_the_fp32_peak() -> None:
    bf16 = _one(LLAMA, precision="bf16")
    fp32 = _one(LLAMA, precision="fp32")
    assert fp32["gemm_time_s"] == pytest.approx(
        bf16["gemm_time_s"] * H100["peak_flops"] / H100["fp32_peak_flops"], rel=1e-12
    )


def test_invalid_layout_rows_are_nan() -> None:
    out = estimate_time(LLAMA, make_grid(num_gpus=[8, 6], tp=4), **H100)
    assert np.isfinite(out["step_time_s"][0])
    assert all(np.isnan(v[1]) for v in out.values())


def test_time_params_overrides_and_validation() -> None:
    p = TimeParams().with_overrides({"gemm_efficiency_max": 0.5})
    assert p.gemm_efficiency_max == 0.5
    slow = _one_with(p)
    assert slow["gemm_time_s"] == pytest.approx(_one_with(TimeParams())["gemm_time_s"] * 0.76 / 0.5)
    with pytest.raises(ValueError, match="unknown key 'nope'"):
        TimeParams().with_overrides({"nope": 1.0})
    with pytest.raises(ValueError, match="gemm_efficiency_max must be in"):
        TimeParams(gemm_efficiency_max=1.5)
    with pytest.raises(ValueError, match="dp_overlap_fraction must be in"):
        TimeParams(dp_overlap_fraction=-0.1)


def _one_with(params: TimeParams) -> dict[str, float]:
    out = estimate_time(LLAMA, make_grid(), **H100, params=params)
    return {k: float(v[0]) for k, v in out.items()}


def test_lora_skips_weight_gradients_and_shrinks_gradient_traffic() -> None:
    row = {"num_gpus": 16, "zero": 3, "micro_batch_size": 2, "seq_len": 4096}
    full = _one(LLAMA, **row)
    lora = _one(LLAMA, **row, lora_rank=16)
    qlora = _one(LLAMA, **row, lora_rank=16, qlora=True)
    assert lora["gemm_time_s"] / full["gemm_time_s"] == pytest.approx(2.0 / 3.0, rel=0.01)
    assert lora["optimizer_time_s"] < 0.01 * full["optimizer_time_s"]
    assert lora["step_time_s"] < full["step_time_s"]
    assert qlora["memory_bound_time_s"] > lora["memory_bound_time_s"]  # NF4 dequantization
    assert qlora["fsdp_exposed_s"] <= lora["fsdp_exposed_s"]  # 4-bit gathers
    assert 0.0 < lora["mfu"] <= lora["hfu"] <= 1.0


def test_offload_moves_the_optimizer_to_the_host() -> None:
    m = load_model("llama-2-13b")
    row = {"num_gpus": 8, "micro_batch_size": 1}
    on_gpu = _one(m, **row, zero=3)
    host = _one(m, **row, zero=3, offload="optimizer")
    streamed = _one(m, **row, zero=3, offload="optimizer+params")
    assert host["optimizer_time_s"] == 0.0 < on_gpu["optimizer_time_s"]
    assert host["offload_s"] > on_gpu["optimizer_time_s"]  # PCIe and a CPU update are slower
    assert streamed["offload_s"] > host["offload_s"] > 0.0
    assert on_gpu["step_time_s"] < host["step_time_s"] < streamed["step_time_s"]


def test_expert_parallel_all_to_all() -> None:
    moe = [name for name in preset_names() if load_model(name).num_experts >= 8]
    if not moe:
        pytest.skip("no mixture-of-experts preset")
    m = load_model(moe[0])
    row = {"num_gpus": 16, "zero": 1, "micro_batch_size": 1, "seq_len": 4096}
    local, within, across = (_one(m, **row, ep=e) for e in (1, 8, 16))
    assert local["expert_s"] == 0.0
    assert 0.0 < within["expert_s"] < across["expert_s"]
