"""The sweep's space: axes from the model and fleet, invalid points kept with a reason."""

from __future__ import annotations

import numpy as np
import pytest

from trainmem.catalog import load_model
from trainmem.engine import REASONS
from trainmem.hardware import load_gpus, parse_fleet
from trainmem.sweep._space import (
    EXCEEDS_POOL,
    TP_CROSSES_NODE,
    VIRTUAL_WITHOUT_PP,
    gpu_counts,
    make_space,
    reason_texts,
)

GPUS = load_gpus()


def _space(fleet: str = "8xh100-sxm-80gb,4xa100-sxm-80gb", **kwargs):
    args = {"seq_len": 1024, "global_batch_size": 32, **kwargs}
    return make_space(load_model("llama-3.2-1b"), parse_fleet(fleet, GPUS), GPUS, **args)


def test_axes_follow_model_and_fleet() -> None:
    space = _space()
    m = space.model
    assert space.axes["pool"] == (0, 1)
    assert space.axes["tp"] == (1, 2, 4, 8)  # powers of two within the biggest node
    assert all(m.num_hidden_layers % p == 0 for p in space.axes["pp"])
    assert space.axes["ep"] == (1,)  # dense model
    assert space.axes["micro_batch_size"] == (1, 2, 4, 8, 16)
    assert space.num_points == int(np.prod(space.shape))
    assert gpu_counts(space.fleet) == [1, 2, 4, 8]


def test_invalid_points_stay_with_a_reason() -> None:
    space = _space()
    res = space.evaluate(np.arange(space.num_points))
    assert len(res["reason"]) == space.num_points
    a100 = res["pool"] == 1  # 4 GPUs in one node
    assert np.all(res["reason"][a100 & (res["tp"] == 8)] != 0)
    assert np.any(res["reason"] == TP_CROSSES_NODE)
    assert np.any(res["reason"] == EXCEEDS_POOL)
    assert np.any(res["reason"] == VIRTUAL_WITHOUT_PP)
    assert np.any(
        res["reason"] == REASONS.index("global_batch_size must be divisible by micro_batch_size*dp")
    )
    assert not np.any(res["fits"] & (res["reason"] != 0))
    valid = res["reason"] == 0
    assert np.all(np.isfinite(res["cost_per_million_tokens"][valid]))
    assert np.all(np.isnan(res["cost_per_million_tokens"][~valid]))
    texts = reason_texts(res["reason"])
    assert set(texts[valid]) == {""} and all(texts[~valid])
    # micro x accum x dp = global on every valid point
    product = res["micro_batch_size"] * res["grad_accum_steps"] * res["dp"]
    assert np.all(product[valid] == 32)


def test_bad_input_is_one_value_error() -> None:
    with pytest.raises(ValueError, match="global-batch-size"):
        _space(global_batch_size=0)
    with pytest.raises(ValueError, match="precision"):
        _space(precision="fp64")


def test_a_range_of_points_builds_the_same_columns_as_its_indices() -> None:
    """Space.columns(range) (runs of values, the exhaustive chunks) equals the index path, and a
    chunk evaluates to the same bytes either way."""
    space = _space(max_micro_batch_size=8)
    n = space.num_points
    rng = np.random.default_rng(0)
    ranges = [
        (0, n),
        (0, 0),
        (n - 1, n),
        (7, 8),
        *(sorted(rng.integers(0, n + 1, 2)) for _ in range(40)),
    ]
    for lo, hi in ranges:
        runs, indexed = space.columns(range(lo, hi)), space.columns(np.arange(lo, hi))
        assert list(runs) == list(indexed)
        for axis, column in runs.items():
            assert column.dtype == indexed[axis].dtype
            assert np.array_equal(column, indexed[axis]), (axis, lo, hi)
    lo, hi = n // 3, n // 3 + 5000
    a, b = space.evaluate(range(lo, hi)), space.evaluate(np.arange(lo, hi))
    assert list(a) == list(b)
    assert all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)
