"""The compiled per-row assembly (engine/_fast/_kernel_numba.py) returns what numpy's does, to the
bit, on random grids of every kind of row: pipelined and interleaved (the worst rank is then one
of two stage variants), gradient accumulation, offload to the host, the expandable-segments
allocator, invalid layouts; and `layout_reason`'s compiled loop the same codes as numpy's.

tests/unit/engine/test_engine_equivalence.py runs both paths against the engine's recording too.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.strategies import random_grid
from trainmem.catalog import load_model
from trainmem.engine import OUTPUTS, Overheads, estimate, layout_reason, make_grid
from trainmem.engine._fast import _kernel

pytest.importorskip("numba", reason="the compiled kernel is the `fast` extra")

ROWS = 30_000
"""Rows per grid: many of each kind of row, well under a second per path."""


def _pick(rng: np.random.Generator, values: list, n: int) -> np.ndarray:
    return np.asarray(values)[rng.integers(0, len(values), n)]


def _grid(seed: int, n: int = ROWS, *, moe: bool = False) -> dict[str, np.ndarray]:
    """Mostly valid layouts of an 8-GPU-per-node world, every declared field drawn
    (tests/strategies.py)."""
    return random_grid(seed, n, moe=moe)


def _both(monkeypatch, call) -> tuple[dict, dict]:
    monkeypatch.setenv(_kernel.KERNEL_ENV, "numpy")
    reference = call()
    monkeypatch.setenv(_kernel.KERNEL_ENV, "numba")
    return reference, call()


def _assert_same(reference: dict, compiled: dict) -> None:
    assert list(compiled) == list(reference)
    for k, want in reference.items():
        assert compiled[k].dtype == want.dtype, k
        np.testing.assert_array_equal(compiled[k], want, err_msg=k, strict=True)


@pytest.mark.parametrize(("model", "seed"), [("llama-3.1-8b", 1), ("gpt2", 2), ("mixtral-8x7b", 3)])
def test_compiled_assembly_equals_numpy(model: str, seed: int, monkeypatch) -> None:
    m = load_model(model)
    g = _grid(seed, moe=m.is_moe)
    usable = np.random.default_rng(seed).choice([24e9, 80e9, 141e9], ROWS)
    ov = Overheads(cublas_workspace_bytes=32 * 2**20, fragmentation_fraction=0.2)

    reference, compiled = _both(
        monkeypatch, lambda: estimate(m, g, usable_bytes=usable, headroom=0.05, overheads=ov)
    )
    _assert_same(reference, compiled)
    assert set(reference) == set(OUTPUTS)
    # The grid reaches what the assembly branches on: both stage variants worst, every phase.
    assert set(np.unique(reference["peak_phase"])) == {0, 1, 2}
    assert np.any(reference["pp_stage"] > 0) and np.any(
        (g["pp"] > 1) & (reference["pp_stage"] == 0)
    )
    assert 0 < np.mean(reference["fits"]) < 1 and np.any(reference["host_bytes"] > 0)


def test_compiled_assembly_from_gathered_blocks_equals_numpy(monkeypatch) -> None:
    """Large tables are copied out block by block first (_kernel.GATHER_MIN_BYTES): forced here,
    with both stage variants and rows past a block boundary."""
    monkeypatch.setattr(_kernel, "GATHER_MIN_BYTES", 0)
    m = load_model("llama-3.1-8b")
    g = _grid(6)
    reference, compiled = _both(monkeypatch, lambda: estimate(m, g, usable_bytes=80e9))
    _assert_same(reference, compiled)
    assert np.any(reference["pp_stage"] > 0)
    one_stage = ("peak_device_bytes", "fits", "host_bytes", "activations_per_layer")
    _assert_same(*_both(monkeypatch, lambda: estimate(m, g, pp_stage=1, columns=one_stage)))


def test_compiled_assembly_equals_numpy_on_a_stage_and_a_subset(monkeypatch) -> None:
    m = load_model("llama-2-7b")
    g = _grid(4)
    stage = np.random.default_rng(4).integers(0, 8, ROWS)
    _assert_same(*_both(monkeypatch, lambda: estimate(m, g, pp_stage=stage)))
    subset = ("peak_device_bytes", "fits", "host_bytes", "pp_stage", "activations_per_layer")
    _assert_same(*_both(monkeypatch, lambda: estimate(m, g, columns=subset)))


@pytest.mark.parametrize("model", ["llama-3.1-70b", "mixtral-8x7b"])
def test_compiled_layout_reason_equals_numpy(model: str, monkeypatch) -> None:
    m = load_model(model)
    rng = np.random.default_rng(5)
    n = ROWS
    g = dict(_grid(5, moe=m.is_moe))
    # Break each rule somewhere: layouts, batches, offload without ZeRO, QLoRA without a rank.
    g.update(
        num_gpus=g["num_gpus"] + (rng.random(n) < 0.05),
        tp=np.where(rng.random(n) < 0.03, 3, g["tp"]),
        global_batch_size=g["global_batch_size"] + (rng.random(n) < 0.05),
        seq_len=np.where(rng.random(n) < 0.03, 4097, g["seq_len"]),
        zero=np.where(rng.random(n) < 0.02, 4, g["zero"]),
        qlora=rng.random(n) < 0.05,
        optimizer_in_backward=rng.random(n) < 0.1,
        dp_shard=_pick(rng, [0, 0, 2, 3], n),
        ep=_pick(rng, [1, 1, 2, 3], n),
    )
    reference, compiled = _both(monkeypatch, lambda: layout_reason(m, g))
    np.testing.assert_array_equal(compiled, reference, strict=True)
    assert len(np.unique(reference)) >= 10  # most rules broken somewhere, and valid rows


def test_kernel_choice(monkeypatch) -> None:
    monkeypatch.setenv(_kernel.KERNEL_ENV, "auto")
    monkeypatch.setattr(_kernel, "_loaded", False)
    assert _kernel.compiled_for(_kernel.KERNEL_MIN_ROWS - 1) is None  # loading it would not pay
    assert not _kernel.preload(_kernel.KERNEL_MIN_ROWS - 1)
    assert _kernel.preload(_kernel.KERNEL_MIN_ROWS)  # a sweep of that many rows loads it
    assert _kernel.compiled_for(_kernel.KERNEL_LOADED_MIN_ROWS) is not None
    assert _kernel.compiled_for(_kernel.KERNEL_LOADED_MIN_ROWS - 1) is None
    monkeypatch.setenv(_kernel.KERNEL_ENV, "numpy")
    assert _kernel.compiled_for(10**9) is None and not _kernel.preload(10**9)
    monkeypatch.setenv(_kernel.KERNEL_ENV, "fortran")
    with pytest.raises(ValueError, match="TRAINMEM_KERNEL: unknown 'fortran'; allowed: auto"):
        _kernel.compiled_for(1)


def test_per_key_terms_in_blocks_equal_one_pass(monkeypatch) -> None:
    """_key_tables evaluates the keys' terms KEY_BLOCK keys at a time: the same bits as one
    pass over every key (the formulas are elementwise over keys)."""
    from trainmem.engine import _estimate

    m = load_model("mixtral-8x7b")
    g = _grid(6, moe=True)
    monkeypatch.setenv(_kernel.KERNEL_ENV, "numpy")
    monkeypatch.setattr(_estimate, "KEY_BLOCK", 1 << 40)
    whole = estimate(m, g)
    monkeypatch.setattr(_estimate, "KEY_BLOCK", 997)
    _assert_same(whole, estimate(m, g))


def test_a_kernel_that_does_not_load_falls_back_to_numpy(monkeypatch) -> None:
    """numba missing, or refusing to cache (no writable folder): auto runs numpy's blocks;
    TRAINMEM_KERNEL=numba says why in one line."""
    import sys

    _kernel._compiled.cache_clear()
    monkeypatch.setitem(sys.modules, "trainmem.engine._fast._kernel_numba", None)  # import fails
    monkeypatch.setattr(_kernel, "_loaded", False)
    monkeypatch.setattr(_kernel, "_unavailable", [])
    try:
        monkeypatch.setenv(_kernel.KERNEL_ENV, "auto")
        assert _kernel.compiled_for(10**9) is None and not _kernel.preload(10**9)
        m = load_model("gpt2")
        assert estimate(m, make_grid(micro_batch_size=[1, 2]))["fits"].all()
        monkeypatch.setenv(_kernel.KERNEL_ENV, "numba")
        with pytest.raises(ValueError, match="TRAINMEM_KERNEL: numba: the compiled kernel does"):
            _kernel.compiled_for(1)
    finally:
        _kernel._compiled.cache_clear()
