"""Laws of the engine-breadth features (issue 3): MoE and expert parallelism, LoRA and QLoRA,
offload, FP8, long context (context parallelism, chunked loss, activation offload), BERT.

Each law is checked over a vectorized grid (the Cartesian product of the fields that matter), so
a file of thousands of configurations runs in seconds and gives the same verdict on every run.
Memory laws hold for one rank, so with pipeline parallelism they are checked on each stage's view
(`estimate(..., pp_stage=k)`); the default view, the worst rank, may switch stage with the inputs.

Counterexamples that break a law today are pinned as strict xfails (their reason gives the
numbers), so that a fix shows up as an unexpected pass.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest

from trainmem.catalog import load_model, preset_names
from trainmem.engine import COMPONENTS, REASONS, ModelSpec, estimate, make_grid

MOE_PRESETS = (
    "mixtral-8x7b",
    "mixtral-8x22b",
    "qwen1.5-moe-a2.7b",
    "qwen3-30b-a3b",
    "deepseek-v2-lite",
    "deepseek-v3",
)
BERT_PRESETS = ("bert-base-uncased", "bert-large-uncased")
DENSE_PRESETS = tuple(n for n in preset_names() if not load_model(n).is_moe)

SUM_RTOL = 1e-12
"""Components are float64 sums of the same terms: only rounding separates them."""
EXACT_RTOL = 1e-9
"""Differences of byte counts up to ~1e12 in float64."""
EP_REASON = next(i for i, text in enumerate(REASONS) if text.startswith("ep must divide"))


def _product(**axes: Iterable[Any]) -> dict[str, list[Any]]:
    """Grid columns for the Cartesian product of the given axes."""
    names = list(axes)
    rows = list(itertools.product(*(list(v) for v in axes.values())))
    return {name: [row[i] for row in rows] for i, name in enumerate(names)}


def _row(cols: dict[str, list[Any]], i: int) -> dict[str, Any]:
    return {k: v[i] for k, v in cols.items()}


def _stages(m: ModelSpec, cols: dict[str, list[Any]], **fixed: Any):
    """(stage, estimate) for every pipeline stage view of the grid (pp at most 2 here)."""
    g = make_grid({**cols, **fixed})
    for stage in range(int(np.max(g["pp"]))):
        yield stage, estimate(m, g, usable_bytes=80e9, pp_stage=stage)


def _model_states(out: dict[str, np.ndarray]) -> np.ndarray:
    """GPU bytes of parameters, master weights, persistent gradients and optimizer states."""
    return (
        out["parameters"] + out["master_weights"] + out["gradients_total"] + out["optimizer_states"]
    )


def _first_bad(cols: dict[str, list[Any]], bad: np.ndarray) -> str:
    if not np.any(bad):
        return ""
    return f"{int(np.sum(bad))} rows, e.g. {_row(cols, int(np.flatnonzero(bad)[0]))}"


# ---- LoRA and QLoRA -------------------------------------------------------------------------


@pytest.mark.parametrize("name", preset_names())
def test_lora_has_fewer_gradient_and_optimizer_bytes_than_full_fine_tuning(name: str) -> None:
    m = load_model(name)
    cols = _product(
        precision=["fp32", "bf16", "amp-bf16", "mixed-bf16", "fp8-mixed"],
        optimizer=["adamw", "adamw-fused", "adamw-8bit", "sgd", "sgd-momentum", "adafactor"],
        zero=[0, 1, 2, 3],
        lora_targets=["all-linear", "q_proj,v_proj"],
    )
    g = {**cols, "num_gpus": 8}
    full = estimate(m, make_grid(g))
    lora = estimate(m, make_grid({**g, "lora_rank": 16}))
    assert np.all(full["reason"] == 0) and np.all(lora["reason"] == 0)
    bad = ~(lora["gradients_total"] < full["gradients_total"])
    assert not bad.any(), _first_bad(cols, bad)
    # Optimizers with state: strictly fewer bytes; SGD without momentum keeps none in both.
    stateful = full["optimizer_states"] > 0
    bad = np.where(
        stateful,
        ~(lora["optimizer_states"] < full["optimizer_states"]),
        lora["optimizer_states"] != 0,
    )
    assert not bad.any(), _first_bad(cols, bad)
    assert np.all(lora["master_weights"] == 0)  # a frozen base keeps no fp32 master copy


@pytest.mark.parametrize("name", preset_names())
def test_qlora_parameters_below_lora_parameters(name: str) -> None:
    """NF4 base weights (0.5 B + constants) below the 16-bit (or fp32) base, unsharded weights.
    Pure bf16 under torchtune: hf's prepare_model_for_kbit_training casts the unquantised rest
    to fp32, which outweighs the NF4 saving where the vocabulary is large (gemma's 256k)."""
    m = load_model(name)
    cols = _product(precision=["fp32", "bf16", "amp-bf16", "mixed-bf16"], zero=[0, 1, 2])
    cols["framework"] = ["torchtune" if p == "bf16" else "hf" for p in cols["precision"]]
    g = {**cols, "num_gpus": 8, "lora_rank": 16}
    lora = estimate(m, make_grid(g))
    qlora = estimate(m, make_grid({**g, "qlora": True}))
    assert np.all(qlora["reason"] == 0)
    bad = ~(qlora["parameters"] < lora["parameters"])
    assert not bad.any(), _first_bad(cols, bad)


def test_qlora_parameters_below_lora_parameters_under_zero3() -> None:
    # Regression: the NF4 base was kept whole under ZeRO-3 (bitsandbytes >= 0.43 shards it).
    m = load_model("llama-3-8b")
    g = {"precision": ["bf16", "amp-bf16"], "zero": 3, "num_gpus": 8, "lora_rank": 16}
    lora = estimate(m, make_grid(g))
    qlora = estimate(m, make_grid({**g, "qlora": True}))
    assert np.all(qlora["parameters"] < lora["parameters"])


# ---- chunked (fused linear + cross-entropy) loss --------------------------------------------

LLAMA3_GRID = _product(
    micro_batch_size=[1, 2, 4],
    seq_len=[512, 1024, 2048, 4096, 8192, 32768],
    precision=["fp32", "bf16", "amp-bf16", "mixed-bf16"],
    recompute=["none", "selective", "full"],
    zero=[0, 1, 3],
    tp=[1, 2],
    pp=[1, 2],
    framework=["hf", "megatron", "deepspeed"],
    global_batch_size=[0, 32],
)
"""Llama-3-8B (128,256-token vocabulary) layouts on 8 GPUs, short to long sequences."""


def _chunked_raises(lora_rank: int, min_tokens: int) -> list[str]:
    """Rows (per stage) where --loss chunked raises activations_total or the allocated peak."""
    m = load_model("llama-3-8b")
    cols = {k: v for k, v in LLAMA3_GRID.items()}
    tokens = np.array(cols["micro_batch_size"]) * np.array(cols["seq_len"])
    keep = tokens >= min_tokens
    cols = {k: [x for x, y in zip(v, keep, strict=True) if y] for k, v in cols.items()}
    fixed = {"num_gpus": 8, "lora_rank": lora_rank}
    failures = []
    full = dict(_stages(m, cols, **fixed))
    for stage, chunked in _stages(m, cols, **fixed, loss="chunked"):
        base = full[stage]
        assert np.all(base["reason"] == 0)
        for key in ("activations_total", "peak_allocated_bytes", "peak_device_bytes"):
            bad = chunked[key] > base[key] * (1 + EXACT_RTOL)
            if bad.any():
                i = int(np.flatnonzero(bad)[np.argmax((chunked[key] / base[key])[bad])])
                failures.append(
                    f"stage {stage} {key}: {int(bad.sum())} rows, worst {_row(cols, i)}: "
                    f"{base[key][i]:.0f} -> {chunked[key][i]:.0f}"
                )
    return failures


@pytest.mark.parametrize(
    "config",
    [
        {"precision": "bf16", "seq_len": 8192},
        {"precision": "amp-bf16", "seq_len": 8192},
        {"precision": "mixed-bf16", "seq_len": 8192, "num_gpus": 8, "zero": 3},
        {"precision": "bf16", "seq_len": 2048, "micro_batch_size": 2, "lora_rank": 16},
        {"precision": "bf16", "seq_len": 32768, "recompute": "full", "lora_rank": 16},
    ],
    ids=["bf16-8k", "amp-8k", "fsdp-mixed-8k", "lora-2x2k", "lora-32k-ckpt"],
)
def test_chunked_loss_lowers_activations_and_peak_for_a_128k_vocabulary(config) -> None:
    m = load_model("llama-3-8b")
    full = estimate(m, make_grid(config))
    chunked = estimate(m, make_grid({**config, "loss": "chunked"}))
    assert chunked["activations_total"][0] < full["activations_total"][0]
    assert chunked["peak_allocated_bytes"][0] < full["peak_allocated_bytes"][0]
    assert chunked["peak_device_bytes"][0] < full["peak_device_bytes"][0]


def test_chunked_loss_never_raises_with_a_frozen_head() -> None:
    """LoRA: the head is frozen, so the fused loss keeps no [vocab, hidden] gradient."""
    assert _chunked_raises(lora_rank=16, min_tokens=0) == []


def test_chunked_loss_never_raises_from_8k_tokens() -> None:
    """Full fine-tuning, 8,192 tokens or more per micro-batch."""
    assert _chunked_raises(lora_rank=0, min_tokens=8192) == []


def test_chunked_loss_moves_the_head_gradient_into_the_forward() -> None:
    """With a trainable head the fused loss keeps grad_weight [V, h] from the forward on (it is
    the head's gradient, early) and grad_input [T, h]; it drops the fp32 log-softmax [T, V]. So at
    short sequences it can hold more than the plain loss (Liger behaves so): the difference is
    exactly those tensors."""
    m = load_model("llama-3-8b")
    h, v = m.hidden_size, m.vocab_size
    for precision, param_e, resid_e in (("bf16", 2, 2), ("fp32", 4, 4), ("amp-bf16", 4, 4)):
        for seq in (512, 2048, 8192):
            full, chunked = (
                estimate(m, make_grid(seq_len=seq, precision=precision, loss=loss))
                for loss in ("full", "chunked")
            )
            expected = param_e * v * h + resid_e * seq * h - 4 * seq * v
            got = chunked["activations_total"][0] - full["activations_total"][0]
            assert got == pytest.approx(expected, rel=1e-9), (precision, seq)


# ---- activation offload ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama-3-8b", "mixtral-8x7b", "gpt2", "bert-base-uncased"])
def test_activation_offload_moves_activations_to_the_host(name: str) -> None:
    """GPU activations drop by exactly what host_bytes gains; the peak never rises."""
    m = load_model(name)
    cols = _product(
        micro_batch_size=[1, 4],
        seq_len=[1024, 8192],
        precision=["fp32", "bf16", "amp-bf16"],
        recompute=["none", "selective", "full"],
        pp=[1, 2],
        framework=["hf", "megatron", "deepspeed"],
        global_batch_size=[0, 32],
        lora_rank=[0, 16],
    )
    on = dict(_stages(m, cols, num_gpus=8, activation_offload=True))
    for stage, off in _stages(m, cols, num_gpus=8):
        assert np.all(off["reason"] == 0)
        moved = off["activations_total"] - on[stage]["activations_total"]
        gained = on[stage]["host_bytes"] - off["host_bytes"]
        assert np.all(moved > 0), _first_bad(cols, ~(moved > 0))
        np.testing.assert_allclose(gained, moved, rtol=EXACT_RTOL)
        bad = on[stage]["peak_allocated_bytes"] > off["peak_allocated_bytes"] * (1 + EXACT_RTOL)
        assert not bad.any(), _first_bad(cols, bad)


# ---- optimizer and parameter offload ----------------------------------------------------------


@pytest.mark.parametrize("name", ["llama-2-7b", "mixtral-8x7b", "qwen2.5-0.5b"])
def test_offload_orders_gpu_model_states(name: str) -> None:
    """ZeRO-3: optimizer+params < optimizer < none on the GPU, the reverse on the host."""
    m = load_model(name)
    cols = _product(
        framework=["hf", "megatron", "deepspeed", "torchtitan"],
        precision=["fp32", "bf16", "amp-bf16", "mixed-bf16"],
        optimizer=["adamw", "adamw-8bit", "sgd-momentum"],
        lora_rank=[0],
    )
    g = {**cols, "num_gpus": 8, "zero": 3}
    offloads = ("none", "optimizer", "optimizer+params")
    none, opt, both = (estimate(m, make_grid({**g, "offload": o})) for o in offloads)
    for out in (none, opt, both):
        assert np.all(out["reason"] == 0)
    for lower, higher in ((both, opt), (opt, none)):
        bad = ~(_model_states(lower) < _model_states(higher))
        assert not bad.any(), _first_bad(cols, bad)
        bad = ~(lower["host_bytes"] > higher["host_bytes"])
        assert not bad.any(), _first_bad(cols, bad)
    assert np.all(none["host_bytes"] == 0)
    for out in (opt, both):
        assert np.all(out["optimizer_states"] == 0)
        assert np.all(out["master_weights"] == 0)


def test_offload_needs_zero() -> None:
    m = load_model("llama-2-7b")
    g = make_grid(
        offload=["optimizer", "optimizer+params", "optimizer+params", "optimizer"],
        zero=[0, 1, 2, 1],
        num_gpus=8,
    )
    reason = estimate(m, g)["reason"]
    assert list(reason[:3] != 0) == [True, True, True]
    assert reason[3] == 0


# ---- context parallelism --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama-3-8b", "mixtral-8x7b", "gpt2", "deepseek-v2-lite"])
def test_cp2_halves_activations_per_layer_with_flash_attention(name: str) -> None:
    m = load_model(name)
    cols = _product(
        seq_len=[2048, 8192, 131072],
        micro_batch_size=[1, 2],
        precision=["fp32", "bf16", "amp-bf16"],
        recompute=["none", "selective", "full"],
        lora_rank=[0, 16],
    )
    one = estimate(m, make_grid({**cols, "attention": "flash"}))
    two = estimate(m, make_grid({**cols, "attention": "flash", "cp": 2, "num_gpus": 2}))
    assert np.all(two["reason"] == 0)
    ratio = two["activations_per_layer"] / one["activations_per_layer"]
    # Per-token terms halve; constants (two 512-byte rng blocks per layer) do not.
    assert np.all(np.abs(ratio - 0.5) < 1e-3), (ratio.min(), ratio.max())


def test_cp_ring_buffers_add_to_the_peak_not_to_saved_activations() -> None:
    m = load_model("llama-3-8b")
    cols = {"seq_len": 131072, "recompute": "full", "precision": "bf16"}
    one = estimate(m, make_grid({**cols, "num_gpus": 2}))
    two = estimate(m, make_grid({**cols, "cp": 2, "num_gpus": 2}))
    assert two["activations_total"][0] < one["activations_total"][0]
    assert two["peak_allocated_bytes"][0] < one["peak_allocated_bytes"][0]


# ---- expert parallelism ---------------------------------------------------------------------


def _weight_bytes(m: ModelSpec, *, expert: bool, ep: int) -> float:
    """16-bit bytes of the routed-expert (or the other) tensors, each rounded to 512 B."""
    total = 0.0
    for p in m.param_tensors():
        if p.expert != expert:
            continue
        numel = p.numel // ep if p.expert else p.numel
        total += np.ceil(2.0 * numel / 512) * 512 * m.group_count(p.group)
    return total


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_ep_divides_the_routed_expert_weights_only(name: str) -> None:
    m = load_model(name)
    eps = [e for e in (1, 2, 4, 8) if m.num_experts % e == 0]
    out = estimate(m, make_grid(ep=eps, num_gpus=8, zero=0, precision="bf16"))
    assert np.all(out["reason"] == 0)
    rest = _weight_bytes(m, expert=False, ep=1)
    for i, ep in enumerate(eps):
        assert out["parameters"][i] == rest + _weight_bytes(m, expert=True, ep=ep), ep
    assert np.all(np.diff(out["parameters"]) < 0)


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_ep_that_does_not_divide_the_experts_or_dp_is_invalid(name: str) -> None:
    m = load_model(name)
    bad_ep = next(e for e in (7, 8, 16) if m.num_experts % e != 0)
    g = make_grid(ep=[bad_ep, 4], num_gpus=[bad_ep * 2, 2])  # dp 2 not divisible by ep 4
    assert list(estimate(m, g)["reason"]) == [EP_REASON, EP_REASON]


@pytest.mark.parametrize("name", DENSE_PRESETS)
def test_ep_changes_nothing_on_a_dense_model(name: str) -> None:
    m = load_model(name)
    out = estimate(m, make_grid(ep=[1, 2], num_gpus=2, zero=1))
    for key in (*COMPONENTS, "host_bytes", "activations_total", "peak_allocated_bytes"):
        assert out[key][0] == out[key][1], key


@pytest.mark.parametrize("name", ["llama-3-8b", "gpt2", "bert-base-uncased"])
def test_ep_on_a_dense_model_is_an_invalid_layout(name: str) -> None:
    m = load_model(name)
    assert estimate(m, make_grid(ep=2, num_gpus=2))["reason"][0] != 0


# ---- FP8 ------------------------------------------------------------------------------------


def _linear_weights(m: ModelSpec) -> int:
    return sum(
        p.numel * m.group_count(p.group)
        for p in m.param_tensors()
        if len(p.shape) == 2 and p.group in ("layer", "mlp", "moe")
    )


@pytest.mark.parametrize("name", ["llama-3-8b", "mixtral-8x7b", "gpt2", "deepseek-v2-lite"])
def test_fp8_keeps_activations_and_adds_the_fp8_weight_cache(name: str) -> None:
    m = load_model(name)
    cols = _product(
        framework=["hf", "megatron", "deepspeed", "torchtitan"],
        zero=[0, 1, 3],
        recompute=["none", "full"],
        micro_batch_size=[1, 2],
    )
    g = {**cols, "num_gpus": 2}
    bf16 = estimate(m, make_grid({**g, "precision": "mixed-bf16"}))
    fp8 = estimate(m, make_grid({**g, "precision": "fp8-mixed"}))
    for key in (
        "activations_total",
        "activations_per_layer",
        "activations_outside_layers",
        "parameters",
        "master_weights",
        "gradients_total",
        "optimizer_states",
    ):
        np.testing.assert_array_equal(fp8[key], bf16[key], err_msg=key)
    extra = fp8["peak_optimizer_step_bytes"] - bf16["peak_optimizer_step_bytes"]
    # Row-wise and column-wise fp8 copies of every linear weight (+ amax histories); under
    # ZeRO-3/FSDP only the two gathered blocks' weights are cast at a time.
    # torchtitan runs torchao's Float8Linear (casts inside each linear, no cache kept).
    te = np.asarray(cols["framework"]) != "torchtitan"
    cached = np.where(
        np.asarray(cols["zero"]) >= 3,
        2.0 * _linear_weights(m) / m.num_hidden_layers * 2.0,
        2.0 * _linear_weights(m),
    )
    cached = np.where(te, cached, 0.0)
    # The delayed-scaling state: 3 amax histories of 1024 fp32 per linear module.
    num_linears = sum(
        m.group_count(p.group)
        for p in m.param_tensors()
        if len(p.shape) == 2 and p.group in ("layer", "mlp", "moe")
    )
    assert np.all(extra >= cached)
    assert np.all(extra <= np.where(te, cached + 3 * 1024 * 4 * num_linears + 1.0, 0.0))
    forward = fp8["peak_forward_bytes"] - bf16["peak_forward_bytes"]
    assert np.all(np.where(te, forward > 0, forward == 0))


# ---- MoE and BERT presets -------------------------------------------------------------------

BROAD = _product(
    tp=[1, 2],
    pp=[1, 2],
    ep=[1, 2],
    zero=[0, 1, 3],
    precision=["bf16", "amp-bf16", "mixed-bf16", "fp8-mixed"],
    recompute=["none", "full"],
    lora_rank=[0, 16],
    offload=["none", "optimizer"],
    loss=["full", "chunked"],
    attention=["flash", "eager"],
    micro_batch_size=[1, 2],
)
"""Every new flag together, on 8 GPUs, sequence 1024."""


def _check_components(name: str, cols: dict[str, list[Any]], **fixed: Any) -> int:
    m = load_model(name)
    out = estimate(m, make_grid({**cols, **fixed}), usable_bytes=80e9)
    ok = out["reason"] == 0
    every = np.stack([out[k] for k in COMPONENTS])
    parts = every[:, ok]
    assert np.all(np.isfinite(parts))
    assert np.all(parts >= 0), _first_bad(cols, ok & (every < 0).any(axis=0))
    np.testing.assert_allclose(parts.sum(axis=0), out["peak_device_bytes"][ok], rtol=SUM_RTOL)
    for key in ("host_bytes", "activations_total", "gradients_total", "peak_allocated_bytes"):
        assert np.all(out[key][ok] >= 0), key
    assert np.all(out["peak_allocated_bytes"][ok] <= out["peak_device_bytes"][ok])
    return int(ok.sum())


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_moe_presets_estimate_with_components_summing_to_the_peak(name: str) -> None:
    assert _check_components(name, BROAD, num_gpus=8, seq_len=1024) > 1000


@pytest.mark.parametrize("name", BERT_PRESETS)
def test_bert_presets_estimate_with_components_summing_to_the_peak(name: str) -> None:
    valid = _check_components(
        name, {k: v for k, v in BROAD.items() if k != "ep"}, num_gpus=8, seq_len=512
    )
    assert valid > 1000


@pytest.mark.parametrize("name", BERT_PRESETS)
def test_bert_activations_are_affine_in_micro_batch(name: str) -> None:
    m = load_model(name)
    cases = _product(
        precision=["fp32", "bf16", "amp-bf16"],
        recompute=["none", "selective", "full"],
        attention=["flash", "eager"],
        lora_rank=[0, 16],
        tp=[1, 2],
        pp=[1, 2],
    )
    mbs = [1, 2, 3, 4]
    cols = {k: [x for x in v for _ in mbs] for k, v in cases.items()}
    cols["micro_batch_size"] = mbs * len(cases["tp"])
    for _, out in _stages(m, cols, num_gpus=4, seq_len=512):
        assert np.all(out["reason"] == 0)
        assert np.all(np.diff(out["activations_total"].reshape(-1, len(mbs)), axis=1) > 0)
        for key in ("activations_total", "activations_per_layer", "activations_outside_layers"):
            a = out[key].reshape(-1, len(mbs))
            steps = np.diff(a, axis=1)
            assert np.all(steps >= 0), key
            np.testing.assert_allclose(steps, steps[:, :1] * np.ones_like(steps), rtol=EXACT_RTOL)
