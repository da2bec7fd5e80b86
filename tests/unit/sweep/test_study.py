"""An Optuna study's keeping: the storage chosen, the rebuild from the points table (equal to the
study it records), the warm start from the coarse space, the one-process lock."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import optuna
import polars as pl
import pytest

from trainmem.sweep._exhaustive import run_exhaustive
from trainmem.sweep._optuna import run_optuna
from trainmem.sweep._space import AXES, PINNED_AXES, THINNED_AXES, coarse_space, zoomed_space
from trainmem.sweep._study import (
    MEMORY,
    WARM_START_ATTR,
    memory_lock,
    rebuild_study,
    resolve_storage,
    warm_start_params,
)

sys.path.insert(0, str(Path(__file__).parent))
from test_search import small_space  # noqa: E402


def test_coarse_space_keeps_every_other_value_and_the_ends() -> None:
    space = small_space()
    coarse = coarse_space(space)
    for axis in AXES:
        full, kept = space.axes[axis], coarse.axes[axis]
        assert set(kept) <= set(full)
        if axis in THINNED_AXES:
            assert kept[0] == full[0] and kept[-1] == full[-1]
            assert set(full[::2]) <= set(kept) and len(kept) <= len(full) // 2 + 1
        elif axis in PINNED_AXES and PINNED_AXES[axis] in full:
            assert kept == (PINNED_AXES[axis],)
        else:
            assert kept == full
    assert coarse.num_points < space.num_points / 3


def test_zoomed_space_is_the_cell_around_a_coarse_point() -> None:
    space = small_space()
    coarse = coarse_space(space)
    point = {a: coarse.axes[a][len(coarse.axes[a]) // 2] for a in AXES}
    zoom = zoomed_space(space, coarse, point)
    for axis in AXES:
        full, cell = space.axes[axis], zoom.axes[axis]
        assert set(cell) <= set(full) and point[axis] in cell
        if axis in THINNED_AXES and axis != "micro_batch_size":
            assert cell == full[full.index(cell[0]) : full.index(cell[-1]) + 1]  # an interval
            assert set(cell) & set(coarse.axes[axis]) <= {
                v
                for v in coarse.axes[axis]
                if abs(coarse.axes[axis].index(v) - coarse.axes[axis].index(point[axis])) <= 1
            }
        elif axis == "micro_batch_size":
            assert cell == coarse.axes[axis]
        else:
            assert cell == full


def test_storage_default_is_in_memory_for_one_worker(tmp_path) -> None:
    assert resolve_storage(tmp_path, "s", storage=None, workers=1) == MEMORY
    sqlite = f"sqlite:///{tmp_path.resolve() / 'optuna.db'}"
    assert resolve_storage(tmp_path, "s", storage=None, workers=2) == sqlite
    assert resolve_storage(tmp_path, "s", storage="postgresql://h/db", workers=2) == (
        "postgresql://h/db"
    )
    with pytest.raises(ValueError, match=r"^storage: .*--storage"):
        resolve_storage(tmp_path, "s", storage=MEMORY, workers=2)
    optuna.create_study(study_name="s", storage=sqlite)  # e.g. begun with --workers 2
    assert resolve_storage(tmp_path, "s", storage=None, workers=1) == sqlite
    assert resolve_storage(tmp_path, "other", storage=None, workers=1) == MEMORY


def test_rebuilt_study_equals_the_study_it_records(tmp_path) -> None:
    """Params, values, constraints and states of the rebuilt trials equal the SQLite study's."""
    space = small_space()
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    run_optuna(space, out=tmp_path, study="r", trials=12, seed=3, batch_size=4, storage=url)
    recorded = optuna.load_study(study_name="r", storage=url).get_trials()
    st = optuna.create_study(directions=["minimize"])
    assert rebuild_study(st, space, out=str(tmp_path), study="r", objectives=("cost",)) == 12
    rebuilt = st.get_trials()
    assert [t.number for t in rebuilt] == [t.number for t in recorded]
    for a, b in zip(rebuilt, recorded, strict=True):
        assert (a.state, a.params, a.distributions) == (b.state, b.params, b.distributions)
        assert a.values == pytest.approx(b.values, rel=1e-12)
        assert a.constraints == pytest.approx(b.constraints, abs=1e-6)  # GiB; bytes rounded


def test_warm_start_trials_come_first_and_are_stored(tmp_path) -> None:
    space = small_space()
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    found = run_optuna(space, out=tmp_path, study="w", trials=12, seed=0, storage=url)
    expected = warm_start_params(space, ("cost",), study="w", num_trials=8)
    assert found.extra["warm_start_trials"] == len(expected) >= 1
    trials = optuna.load_study(study_name="w", storage=url).get_trials()
    warm = [t for t in trials if t.user_attrs.get(WARM_START_ATTR)]
    assert [t.number for t in warm] == list(range(len(expected)))
    assert [t.params for t in warm] == expected
    assert all(t.state.name == "COMPLETE" for t in warm)
    points = pl.read_parquet(sorted(Path(found.parquet).glob("part-*.parquet")))
    assert set(range(len(expected))) <= set(points["trial"].unique().to_list())
    coarse = run_exhaustive(coarse_space(space), out=None, study="c").best[0]
    assert found.best[0]["cost_per_million_tokens"] <= coarse["cost_per_million_tokens"]


def test_no_warm_start_enqueues_nothing(tmp_path) -> None:
    found = run_optuna(small_space(), out=tmp_path, study="n", trials=4, warm_start=False)
    assert found.extra["warm_start_trials"] == 0 and found.extra["complete_trials"] == 4


def test_a_second_process_on_an_in_memory_study_is_refused(tmp_path) -> None:
    with (
        memory_lock(tmp_path, "m"),
        pytest.raises(
            ValueError, match=r"^storage: study 'm' is being searched in memory .*--storage"
        ),
    ):
        run_optuna(small_space(), out=tmp_path, study="m", trials=2)
    assert (
        run_optuna(small_space(), out=tmp_path, study="m", trials=2).extra["complete_trials"] == 2
    )
    assert not list((tmp_path / "points" / "study=m").glob(".optuna-memory.lock"))


def test_a_study_of_another_space_is_refused(tmp_path) -> None:
    space = small_space()
    run_optuna(space, out=tmp_path, study="a", trials=4, batch_size=4)
    other = dataclasses.replace(space, axes={**space.axes, "num_gpus": (4,)})
    with pytest.raises(ValueError, match=r"^study: .*num_gpus .*--study-name"):
        run_optuna(other, out=tmp_path, study="a", trials=8)
