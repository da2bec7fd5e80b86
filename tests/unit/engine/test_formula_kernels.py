"""The per-key formulas generated as one loop (engine/_fast/_formula_trace.py traces them,
engine/_fast/_formula_kernels.py writes the loop) return numpy's bits, model by model.

The generator is checked without compiling (the generated source run as Python on numpy
scalars) on every family's formulas; numba's compiled loop on whole estimates of two models
(compiling one model's two kernels takes 10-20 s). tests/unit/engine/test_kernel.py compares
the compiled path on its larger grids too.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.strategies import random_grid
from trainmem.catalog import load_model, load_profile
from trainmem.engine import estimate, make_grid
from trainmem.engine._fast import _formula_kernels, _formula_trace, _kernel

TABLE_TERMS = ("_state_table_terms", "_activation_table_terms")
"""engine/_estimate.py's per-key functions: state_terms, activation_terms and what they add."""
MODELS = (
    "llama-3.1-8b",
    "mixtral-8x7b",
    "deepseek-v2-lite",
    "gemma-3-4b",
    "gemma-2-9b",
    "falcon-7b",
    "gpt2",
    "phi-3-mini",
)


def _grid(seed: int, n: int, *, moe: bool) -> dict[str, np.ndarray]:
    """Every declared field drawn (tests/strategies.py), valid and invalid layouts both: a
    tenth of the rows at a sequence length no cp divides and no allocator block rounds evenly
    (100 tokens), and on 64 more data-parallel ranks."""
    rng = np.random.default_rng(seed)
    g = random_grid(seed, n, moe=moe)
    odd = rng.random(n) < 0.1
    return {
        **g,
        "seq_len": np.where(odd, 100, g["seq_len"]),
        "num_gpus": np.where(rng.random(n) < 0.1, g["num_gpus"] * 64, g["num_gpus"]),
    }


def _per_key_calls(m, g) -> list[tuple]:
    """(formula function, its per-key columns) of every per-key pass of estimate(m, g) (numpy's
    formulas; the settings are restored after)."""
    calls: list[tuple] = []

    def spy(model, fn, columns, num_keys):
        calls.append((fn, {k: v.copy() for k, v in columns.items()}))

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(_kernel.KERNEL_ENV, "numpy")
        patch.setattr(_kernel, "formulas_for", spy)
        estimate(m, g)
    return calls


@pytest.mark.parametrize("model", [*MODELS, "profile:t5-v1_1-base-amp-bf16"])
def test_generated_formulas_equal_numpy(model: str) -> None:
    """The generator on every family's formulas, and on a traced profile's (its own terms)."""
    if model.startswith("profile:"):
        m = load_profile(model.split(":", 1)[1])
        g = make_grid(micro_batch_size=np.arange(1, 41), seq_len=np.repeat([128, 512], 20))
    else:
        m = load_model(model)
        g = _grid(7, 400, moe=m.is_moe)
    calls = _per_key_calls(m, g)
    assert {fn.__name__ for fn, _ in calls} == set(TABLE_TERMS)
    for fn, columns in calls:
        program = _formula_trace.trace(fn, m, {k: v.dtype for k, v in columns.items()})
        names = tuple(program.outputs)
        kernel = _formula_kernels.interpret(_formula_kernels.source(program, names))
        n = len(columns["tp"])
        got = np.empty((n, len(names)))
        with np.errstate(all="ignore"):
            kernel(*columns.values(), got)
            want = fn(m, columns)
        for k, row in zip(names, got.T, strict=True):
            expected = np.broadcast_to(np.asarray(want[k], dtype=np.float64), (n,))
            np.testing.assert_array_equal(row, expected, err_msg=f"{model} {fn.__name__} {k}")


@pytest.mark.parametrize(("model", "seed"), [("llama-3.1-8b", 1), ("mixtral-8x7b", 2)])
def test_compiled_formulas_equal_numpy(model: str, seed: int, monkeypatch) -> None:
    """Whole estimates with the formulas compiled (forced on a small grid) equal numpy's."""
    m = load_model(model)
    g = _grid(seed, 3000, moe=m.is_moe)
    monkeypatch.setenv(_kernel.KERNEL_ENV, "numpy")
    reference = estimate(m, g, usable_bytes=80e9)
    monkeypatch.setenv(_kernel.KERNEL_ENV, "numba")
    monkeypatch.setattr(_kernel, "FORMULA_MIN_KEYS", 0)
    ran: list[str] = []
    real_run = _kernel._Formulas.run

    def run(self, columns):
        ran.append(self.fn.__name__)
        return real_run(self, columns)

    monkeypatch.setattr(_kernel._Formulas, "run", run)
    compiled = estimate(m, g, usable_bytes=80e9)
    assert set(TABLE_TERMS) <= set(ran), _kernel.formula_fallbacks
    for k, want in reference.items():
        np.testing.assert_array_equal(compiled[k], want, err_msg=k, strict=True)
    markers = list(_formula_kernels.cache_dir().glob("formulas_*.ok"))
    assert len(markers) >= 2  # compiled and checked: `auto` takes them from now on

    # A later process (fresh in-process state) under `auto`, numba loaded for a large grid or a
    # sweep: the machine code on disk serves grids as small as a sweep's chunks.
    monkeypatch.setenv(_kernel.KERNEL_ENV, "auto")
    monkeypatch.setattr(_kernel, "FORMULA_MIN_KEYS", 1 << 14)
    monkeypatch.setattr(_kernel, "_formulas", {})
    monkeypatch.setattr(_kernel, "_compile_formulas", False)
    monkeypatch.setattr(_kernel, "_loaded", True)
    small = [(fn, {k: v[:100] for k, v in c.items()}) for fn, c in _per_key_calls(m, g)]
    for fn, columns in small:
        assert _kernel.formulas_for(m, fn, columns, 100) is not None, _kernel.formula_fallbacks
    other = load_model("phi-3-mini")  # compiled by no test: numpy's formulas
    for fn, columns in _per_key_calls(other, _grid(5, 300, moe=False)):
        assert _kernel.formulas_for(other, fn, columns, 300) is None


def test_untraceable_formulas_stay_numpy(monkeypatch) -> None:
    def inspects(m, c):  # a value tested in Python: the trace cannot follow it
        return {"x": c["tp"] * 2.0 if c["tp"] > 1 else c["tp"] * 1.0}

    monkeypatch.setenv(_kernel.KERNEL_ENV, "numba")
    monkeypatch.setattr(_kernel, "FORMULA_MIN_KEYS", 0)
    monkeypatch.setattr(_kernel, "FORMULA_LOADED_MIN_KEYS", 0)
    monkeypatch.setattr(_kernel, "formula_fallbacks", [])
    columns = {"tp": np.array([1, 2, 4])}
    assert _kernel.formulas_for(load_model("gpt2"), inspects, columns, 3) is None
    assert _kernel.formula_fallbacks == [
        "test_untraceable_formulas_stay_numpy.<locals>.inspects: a traced value's truth tested "
        "in Python"
    ]


def test_auto_does_not_compile_a_new_model(monkeypatch, tmp_path) -> None:
    """Under `auto` a model without machine code keeps numpy's formulas (compiling costs more
    than most grids save), even after a sweep preloaded the compiled loop."""
    pytest.importorskip("numba")
    m = load_model("gpt2")
    calls = _per_key_calls(m, _grid(3, 200, moe=False))
    monkeypatch.setenv(_kernel.KERNEL_ENV, "auto")
    monkeypatch.setenv(_formula_kernels.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(_kernel, "FORMULA_MIN_KEYS", 0)
    monkeypatch.setattr(_kernel, "_compile_formulas", False)
    monkeypatch.setattr(_kernel, "_formulas", {})
    monkeypatch.setattr(_kernel, "_loaded", False)
    assert _kernel.preload(1 << 40)  # a huge sweep: the compiled loop loads, the formulas stay
    for fn, columns in calls:
        assert _kernel.formulas_for(m, fn, columns, len(columns["tp"])) is None
    assert not list(tmp_path.rglob("formulas_*"))


def test_an_unwritable_cache_keeps_numpy(monkeypatch, tmp_path) -> None:
    """Nowhere to write the generated source: numpy's formulas, and the reason kept."""
    pytest.importorskip("numba")
    m = load_model("gpt2")
    fn, columns = _per_key_calls(m, _grid(4, 50, moe=False))[0]
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(_formula_kernels.CACHE_ENV, str(blocker))
    monkeypatch.setenv(_kernel.KERNEL_ENV, "numba")
    monkeypatch.setattr(_kernel, "FORMULA_MIN_KEYS", 0)
    monkeypatch.setattr(_kernel, "FORMULA_LOADED_MIN_KEYS", 0)
    monkeypatch.setattr(_kernel, "formula_fallbacks", [])
    monkeypatch.setattr(_kernel, "_formulas", {})
    assert _kernel.formulas_for(m, fn, columns, len(columns["tp"])) is None
    assert len(_kernel.formula_fallbacks) == 1
    assert _kernel.formula_fallbacks[0].startswith(f"{fn.__qualname__} (gpt2): ")


def test_numba_caches_outside_the_package(tmp_path) -> None:
    """numba's machine code goes to trainmem's cache folder, not beside the modules in
    site-packages (where pip's uninstall would leave it, breaking a later editable install)."""
    pytest.importorskip("numba")
    env = {**os.environ, _formula_kernels.CACHE_ENV: str(tmp_path)}
    env.pop("NUMBA_CACHE_DIR", None)
    code = (
        "import os; from trainmem.engine._fast import _kernel; "
        "assert _kernel._compiled() is not None; "
        "print(os.environ['NUMBA_CACHE_DIR'])"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr
    # one folder per version of the engine's sources (numba checks only the jitted function's
    # own file: assemble_rows would reuse code that inlined an older _assembly.py)
    assert run.stdout.strip() == str(tmp_path / "numba" / _kernel.engine_sources_digest())
    assert list((tmp_path / "numba").rglob("*.nbi"))  # reason_rows, compiled on import
