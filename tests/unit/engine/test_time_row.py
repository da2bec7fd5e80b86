"""estimate_time_one() (engine/_fast/_time_row.py) returns, for each valid configuration, what
estimate_time() returns in that configuration's row: every column, to the bit, on the engine
recording's rows (every family, a traced profile) and on rows drawn from the declarations
(tests/strategies.py: every field, every preset), on GPUs with and without bf16 and fp8, with
and without `tokens`, with the default and with overridden time constants; and it runs the
generated program (not its numpy fallback) for every preset."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.strategies import columns_of, models, rows
from tests.unit.engine.test_scalar import CASES, PROFILE, _rows
from trainmem.catalog import load_model, load_profile, preset_names
from trainmem.engine import TimeParams, estimate_time, layout_reason, make_grid, time_inputs
from trainmem.engine._fast import _time_row
from trainmem.engine._fast._scalar import encode_row
from trainmem.engine._fast._time_row import estimate_time_one
from trainmem.hardware import get_gpu

GPUS = ("h100-sxm-80gb", "v100-sxm2-16gb", "mi300x-192gb")
"""fp8 and bf16; neither bf16 nor fp8 (fp16 peak); another vendor's rates and links."""
PARAMS = (
    None,
    TimeParams(gemm_efficiency_max=0.61, fsdp_overlap_fraction=0.3, ring_step_latency_s=1e-4),
)


def _same_bits(got: dict[str, float], want: dict[str, np.ndarray], i: int, label: str) -> None:
    assert list(got) == list(want), label
    for k, column in want.items():
        expected = np.float64(column[i])
        assert isinstance(got[k], float), (label, k)
        same = np.float64(got[k]).tobytes() == expected.tobytes() or (
            expected != expected and got[k] != got[k]
        )
        assert same, f"{label} row {i} {k}: {got[k]!r} != {expected!r}"


def _check(m, cols: dict, label: str) -> int:
    """estimate_time_one against estimate_time on every valid row of `cols`; rows checked."""
    g = make_grid(cols)
    valid = np.flatnonzero(layout_reason(m, g) == 0)
    encoded = [encode_row(r) for r in _rows(g)]
    for gpu in GPUS:
        links = time_inputs(get_gpu(gpu))
        for params in PARAMS:
            for tokens in (None, 3e11):
                want = estimate_time(m, g, **links, tokens=tokens, params=params)
                for i in valid:
                    got = estimate_time_one(m, encoded[i], links, tokens=tokens, params=params)
                    _same_bits(got, want, i, f"{label} {gpu} {params is None} {tokens}")
    return len(valid)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_estimate_time_one_equals_estimate_time(case) -> None:
    name, cols, _ = case
    m = load_profile(PROFILE) if name == "profile" else load_model(name)
    assert _check(m, cols, name) > 0  # the recording has valid rows of every model


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=60)
@given(st.data())
def test_estimate_time_one_equals_a_drawn_row(data: st.DataObject) -> None:
    """Valid rows of every field drawn (user optimizers, LoRA / QLoRA, offload, fp8, HSDP)."""
    m = data.draw(models())
    drawn = data.draw(st.lists(rows(m), min_size=1, max_size=3))
    _check(m, columns_of(drawn), m.name)


def test_every_preset_runs_the_generated_program() -> None:
    """The numpy fallback (an untraceable formula) stays for what the tracer cannot follow:
    every preset and the traced profile get the program."""
    _time_row._programs.clear()
    for m in [*(load_model(n) for n in preset_names()), load_profile(PROFILE)]:
        for rl in (False, True):  # the RL rows' program and the others'
            program = _time_row._program_of(m, TimeParams(), with_tokens=True, rl=rl)
            assert program.function is not None, (m.name, rl)


def test_rl_rows_equal_estimate_time() -> None:
    """RL rows (their rollout, score, critic, sync and offload terms) take their own program:
    the same floats as estimate_time on them, beside a row without RL."""
    m = load_model("qwen2.5-7b")
    base = dict(num_gpus=8, zero=3, seq_len=1536, micro_batch_size=2, global_batch_size=64)
    drawn = [
        base,
        {**base, "rl": "grpo", "rl_group_size": 8, "response_len": 512, "rollout_tp": 2},
        {**base, "rl": "ppo", "rl_group_size": 1, "response_len": 512, "rl_mean_seq_len": 400},
        {**base, "rl": "dpo", "lora_rank": 16},
        {**base, "rl": "grpo", "rl_trainer_offload": "params+optimizer", "ref_model": "offloaded"},
    ]
    assert _check(m, columns_of(drawn), m.name) == len(drawn)


def test_the_report_uses_the_row_values() -> None:
    """The public report's `time` is estimate_time's row (the same floats)."""
    import trainmem

    m = load_model("llama-3.2-1b")
    config = {"micro_batch_size": 2, "seq_len": 2048, "num_gpus": 8, "zero": 3, "tp": 2}
    report = trainmem.estimate(config, model="llama-3.2-1b", gpu="h100-sxm-80gb", advice=False)
    want = estimate_time(m, make_grid(report["config"]), **time_inputs(get_gpu("h100-sxm-80gb")))
    assert report["time"]["step_time_s"] == float(want["step_time_s"][0])
    assert report["time"]["parts"]["fsdp_exposed_s"] == float(want["fsdp_exposed_s"][0])


def test_the_numpy_fallback_answers_the_same(monkeypatch) -> None:
    """Where the trace fails (Untraceable), estimate_time on the one-row grid answers."""
    from trainmem.engine._fast._formula_trace import Untraceable

    def untraceable(*args, **kwargs):
        raise Untraceable("forced")

    monkeypatch.setattr(_time_row, "time_program", untraceable)
    monkeypatch.setattr(_time_row, "_programs", {})
    m = load_model("qwen2.5-7b")
    cols = {"micro_batch_size": [1, 4], "seq_len": [4096, 1024], "num_gpus": 16, "tp": [2, 4]}
    cols.update(zero=[3, 1], precision=["fp8-mixed", "mixed-bf16"], offload=["none", "optimizer"])
    assert _check(m, cols, "fallback") == 2
    assert all(p.function is None for p in _time_row._programs.values())


SPECIAL = (-2.5, -0.5, -0.0, 0.0, 0.3, 1.0, 2.5, 7.0000001, 4503599627370497.0, 1e300, -1e300)
SPECIAL += (float("inf"), float("-inf"), float("nan"), -1e-300)


def test_python_forms_of_floor_ceil_clip_any() -> None:
    """The generated Python of np.floor, np.ceil, np.clip and an `if not np.any(mask)`
    shortcut gives numpy's bits (signed zeros, infinities, NaN)."""
    from trainmem.engine._fast import _rows
    from trainmem.engine._fast._formula_trace import trace

    def formulas(_, c):
        x, lo = c["x"], c["lo"]
        shortcut = np.zeros(1) if not np.any(x > lo) else np.where(x > lo, x, 0.0)
        return {
            "floor": np.floor(x),
            "ceil": np.ceil(x),
            "clip": np.clip(x, lo, 3.0),
            "clip_int": np.clip(np.floor(x / c["n"]), 1.0, c["n"]),
            "shortcut": shortcut,
        }

    columns = {"x": np.dtype(np.float64), "lo": np.dtype(np.float64), "n": np.dtype(np.int64)}
    p = trace(formulas, None, columns)
    tables: dict = {}
    params = ("x", "lo", "n")
    body = _rows.row_function(p, "f", params, {k: k for k in params}, python=True, tables=tables)
    namespace: dict = {}
    exec("\n".join([_rows._PY_PRELUDE, *body]), namespace)
    for x in SPECIAL:
        for lo in (-1.0, 0.0, float("nan")):
            for n in (1, 8):
                with np.errstate(all="ignore"):
                    want = formulas(None, {"x": np.array([x]), "lo": np.array([lo]), "n": n})
                got = dict(zip(p.outputs, namespace["f"](x, lo, n), strict=True))
                for k, v in want.items():
                    w = np.float64(np.asarray(v).reshape(-1)[0])
                    assert np.float64(got[k]).tobytes() == w.tobytes() or (
                        w != w and got[k] != got[k]
                    ), (k, x, lo, n)
