"""The engine's outputs equal, column by column and to the bit, a recording of the engine as it
was before it was reorganised one module per technique (issue "the engine organised by
technique").

About 2,000 random rows (fixed seed) over presets of every family (dense, MoE, MLA, GPT-2, BERT,
sliding window, fused projections) and a traced profile, with random valid and invalid fields
(invalid layouts keep their `reason`; their memory columns are still computed). Each case is
evaluated by `estimate` (worst rank), `estimate` on a given pipeline stage, `estimate` with a
few columns, and `estimate_time`. The inputs are stored with the outputs, so the test does not
depend on numpy's random streams.

Exact equality, NaN == NaN. Re-record only for a deliberate change of a formula:
    python tests/unit/engine/test_engine_equivalence.py --record
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

RECORDING = Path(__file__).parent / "data" / "engine_recording.npz"
PROFILE = Path(__file__).parents[2] / "data" / "profiles" / "vit-base.json"
SEED = 20240611
ROWS_PER_CASE = 100
MODELS = (
    "llama-2-7b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "tinyllama-1.1b",
    "llama-3.2-1b",
    "gpt2",
    "gpt2-medium",
    "gpt3-175b",
    "bert-base-uncased",
    "gemma-2b",
    "mistral-7b",
    "phi-3-mini",
    "qwen2-1.5b",
    "qwen2.5-0.5b",
    "mixtral-8x7b",
    "qwen1.5-moe-a2.7b",
    "deepseek-v2-lite",
    "deepseek-v3",
    "qwen3-30b-a3b",
    "profile",
)
"""Presets of every family, MoE and MLA among them; "profile" is tests/data/profiles/vit-base."""
SUBSET = ("peak_device_bytes", "fits", "host_bytes", "optimizer_step_temporaries", "pp_stage")
"""The columns of the `columns=` call (optional terms of the per-key tables among them)."""
GPU = {
    "peak_flops": 989e12,
    "fp32_peak_flops": 67e12,
    "hbm_bytes_per_s": 3.35e12,
    "intra_node_bytes_per_s": 450e9,
    "inter_node_bytes_per_s": 50e9,
    "pcie_bytes_per_s": 64e9,
    "price_per_gpu_hour_usd": 2.5,
}
"""H100-like step-time inputs (gpus_per_node varies per row)."""


def _pick(rng: np.random.Generator, values: list[Any], n: int) -> np.ndarray:
    return np.asarray(values)[rng.integers(0, len(values), n)]


def random_columns(rng: np.random.Generator, n: int, *, moe: bool) -> dict[str, np.ndarray]:
    """n configurations, mostly valid layouts, every field drawn; about a third break a rule."""
    tp = _pick(rng, [1, 1, 1, 2, 2, 4, 4, 8, 8, 1, 2, 3], n)
    pp = _pick(rng, [1, 1, 1, 2, 2, 2, 4, 4, 1, 2, 4, 3], n)
    cp = _pick(rng, [1, 1, 1, 2, 4], n)
    dp = _pick(rng, [1, 2, 4, 8, 16], n)
    mb = _pick(rng, [1, 1, 2, 3, 4, 8, 1, 1, 2, 3, 4, 8, 1, 2, 0], n)
    ep = _pick(rng, [1, 1, 2, 4, 8] if moe else [1] * 19 + [2], n)
    custom = rng.random(n) < 0.12
    lora_rank = _pick(rng, [0, 0, 0, 0, 0, 8, 16, 64], n)
    return {
        "micro_batch_size": mb,
        "seq_len": _pick(rng, [128, 512, 1000, 2048, 4096, 4097, 8192], n),
        "num_gpus": tp * pp * cp * dp + (rng.random(n) < 0.08),
        "global_batch_size": np.where(
            rng.random(n) < 0.6, 0, np.maximum(mb, 1) * dp * _pick(rng, [1, 2, 3, 8], n)
        )
        + (rng.random(n) < 0.05),
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "virtual_stages": _pick(rng, [1, 1, 1, 1, 1, 2], n),
        "zero": _pick(rng, [0, 1, 2, 3] * 4 + [4], n),
        "sequence_parallel": rng.random(n) < 0.5,
        "precision": rng.integers(0, 8, n),
        "optimizer": rng.integers(0, 7, n),
        "recompute": rng.integers(0, 3, n),
        "attention": rng.integers(0, 2, n),
        "framework": rng.integers(0, 4, n),
        "ep": ep,
        "etp": _pick(rng, [1, 1, 1, 2] if moe else [1] * 19 + [2], n),
        "capacity_factor_pct": _pick(rng, [0, 0, 0, 125, 200], n),
        "offload": _pick(rng, [0, 0, 0, 1, 2], n),
        "lora_rank": lora_rank,
        "lora_targets": np.where(rng.random(n) < 0.5, 127, rng.integers(0, 128, n)),
        "qlora": rng.random(n) < np.where(lora_rank > 0, 0.4, 0.03),
        "loss": _pick(rng, [0, 0, 0, 1], n),
        "activation_offload": rng.random(n) < 0.15,
        "optimizer_custom": custom,
        "optimizer_num_states": np.where(custom, _pick(rng, [0.0, 1.0, 1.5, 2.0, 3.0], n), 0.0),
        "optimizer_state_bytes": np.where(custom, _pick(rng, [0.0, 1.0, 2.0, 4.0], n), 0.0),
        "optimizer_temp_states": np.where(custom, _pick(rng, [0.0, 1.0, 2.0], n), 0.0),
        "optimizer_eight_bit": custom & (rng.random(n) < 0.3),
        "optimizer_step_bytes": np.where(custom, _pick(rng, [12.0, 20.0, 28.0], n), 0.0),
    }


def make_cases(seed: int = SEED) -> list[tuple[str, dict[str, np.ndarray], dict[str, Any]]]:
    """(model name, grid columns, call options) per case, ROWS_PER_CASE rows each."""
    rng = np.random.default_rng(seed)
    cases = []
    for name in MODELS:
        moe = name.startswith(("mixtral", "qwen1.5-moe", "deepseek", "qwen3-30b"))
        cols = random_columns(rng, ROWS_PER_CASE, moe=moe)
        if name == "profile":  # mostly the rows the profile was traced for (bf16, eager)
            traced = rng.random(ROWS_PER_CASE) < 0.7
            fixed = {
                "precision": 1,
                "recompute": 0,
                "attention": 1,
                "tp": 1,
                "cp": 1,
                "ep": 1,
                "etp": 1,
                "lora_rank": 0,
                "qlora": False,
                "loss": 0,
            }
            for k, value in fixed.items():
                cols[k] = np.where(traced, value, cols[k])
            dp = _pick(rng, [1, 2, 4], ROWS_PER_CASE)
            cols["num_gpus"] = np.where(traced, cols["pp"] * dp, cols["num_gpus"])
        options = {
            "pp_stage": rng.integers(0, 4, ROWS_PER_CASE),
            "gpus_per_node": _pick(rng, [4.0, 8.0], ROWS_PER_CASE),
            "usable_bytes": float(_pick(rng, [24e9, 80e9, 141e9], 1)[0]),
        }
        cases.append((name, cols, options))
    return cases


def load(engine: ModuleType, name: str) -> Any:
    from trainmem.catalog import load_model, load_profile  # files -> specs live outside engine

    return load_profile(PROFILE) if name == "profile" else load_model(name)


def evaluate(
    engine: ModuleType, name: str, cols: dict[str, np.ndarray], options: dict[str, Any]
) -> dict[str, np.ndarray]:
    """Every output column of the four calls, keyed "<call>.<column>"."""
    m = load(engine, name)
    g = engine.make_grid(cols)
    out: dict[str, np.ndarray] = {}
    calls = {
        "worst": engine.estimate(m, g, usable_bytes=options["usable_bytes"]),
        "stage": engine.estimate(m, g, pp_stage=options["pp_stage"]),
        "subset": engine.estimate(m, g, columns=SUBSET),
        "time": engine.estimate_time(
            m, g, **GPU, gpus_per_node=options["gpus_per_node"], tokens=1e9
        ),
    }
    for call, columns in calls.items():
        out.update({f"{call}.{k}": np.asarray(v) for k, v in columns.items()})
    return out


def record(engine: ModuleType, path: Path = RECORDING) -> None:
    """Write the inputs and every output of every case to `path` (compressed)."""
    arrays: dict[str, np.ndarray] = {}
    for i, (name, cols, options) in enumerate(make_cases()):
        arrays[f"{i:02d}.model"] = np.array(name)
        arrays.update({f"{i:02d}.in.{k}": np.asarray(v) for k, v in cols.items()})
        arrays.update({f"{i:02d}.opt.{k}": np.asarray(v) for k, v in options.items()})
        outputs = evaluate(engine, name, cols, options)
        arrays.update({f"{i:02d}.out.{k}": v for k, v in outputs.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)


def recorded_cases() -> list[tuple[str, dict[str, np.ndarray], dict[str, Any], dict]]:
    with np.load(RECORDING) as data:
        keys = list(data.keys())
        cases = []
        for i in sorted({k.split(".", 1)[0] for k in keys}):

            def part(kind: str, i: str = i) -> dict[str, np.ndarray]:
                prefix = f"{i}.{kind}."
                return {k[len(prefix) :]: data[k] for k in keys if k.startswith(prefix)}

            options: dict[str, Any] = part("opt")
            options["usable_bytes"] = float(options["usable_bytes"])
            cases.append((str(data[f"{i}.model"]), part("in"), options, part("out")))
    return cases


CASES = recorded_cases() if RECORDING.exists() else []


def test_recording_covers_the_engine() -> None:
    import trainmem.engine as engine

    assert len(CASES) == len(MODELS)
    rows = sum(len(c[1]["tp"]) for c in CASES)
    assert rows >= 2000
    valid = sum(int(np.sum(c[3]["worst.reason"] == 0)) for c in CASES)
    assert 0.2 * rows < valid < 0.9 * rows, valid  # both valid and invalid layouts
    outputs = {k.split(".", 1)[1] for k in CASES[0][3] if k.startswith("worst.")}
    assert outputs == set(engine.OUTPUTS)


@pytest.mark.parametrize("kernel", ["numpy", "numba"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_engine_equals_recording(case: tuple, kernel: str, monkeypatch) -> None:
    """Both per-row assemblies (engine/_fast/_kernel.py): numpy's and the compiled loop, forced here
    on grids far below the size where `auto` would take it."""
    import trainmem.engine as engine

    if kernel == "numba":
        pytest.importorskip("numba", reason="the compiled kernel is the `fast` extra")
    monkeypatch.setenv("TRAINMEM_KERNEL", kernel)
    name, cols, options, expected = case
    got = evaluate(engine, name, cols, options)
    assert sorted(got) == sorted(expected)
    for key, want in expected.items():
        assert got[key].dtype == want.dtype, key
        np.testing.assert_array_equal(got[key], want, err_msg=f"{name}: {key}", strict=True)


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        raise SystemExit(f"usage: python {sys.argv[0]} --record")
    import trainmem.engine as engine

    record(engine)
    print(f"wrote {RECORDING} ({RECORDING.stat().st_size:,} bytes)")
