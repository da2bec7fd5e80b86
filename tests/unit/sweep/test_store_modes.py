"""`--store`: what each mode keeps of an exhaustive sweep's points, one row per layout for
best-per-layout, the same search result whatever is stored, and metadata that says so."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

from trainmem.results import read_metadata
from trainmem.sweep._axes import INNER_AXES
from trainmem.sweep._exhaustive import run_exhaustive, space_fingerprint
from trainmem.sweep._options import STORE_MODES
from trainmem.sweep._parts import LAYOUT, LAYOUT_AXES, points_per_layout
from trainmem.sweep._points import _sort_keys
from trainmem.sweep._space import AXES

sys.path.insert(0, str(Path(__file__).parent))
from test_search import small_space  # noqa: E402

CHUNK = 500
"""Not a multiple of the 108 points of a layout: best-per-layout rounds it to whole layouts."""
CONFIG = ["gpu", *[a for a in AXES if a != "pool"]]


def _stored(out: Path, study: str) -> pl.DataFrame:
    """A study's stored points as strings, without the study column (one study per mode)."""
    parts = sorted((out / "points" / f"study={study}").glob("part-*.parquet"))
    frame = pl.read_parquet(parts).with_columns(pl.col(pl.Categorical).cast(pl.String))
    return frame.drop("study")


def _without_study(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "study"} for row in rows]


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory) -> tuple[Path, dict]:
    """One sweep of the small space per store mode, into one folder."""
    out = tmp_path_factory.mktemp("store")
    results = {
        mode: run_exhaustive(small_space(), out=out, study=mode, chunk_size=CHUNK, store=mode)
        for mode in STORE_MODES
    }
    return out, results


def test_layout_is_every_axis_but_the_memory_knobs() -> None:
    assert AXES[: len(LAYOUT_AXES)] == LAYOUT_AXES
    assert set(AXES) - set(LAYOUT_AXES) == set(INNER_AXES)
    assert points_per_layout(small_space()) == 3 * 3 * 2 * 3  # zero x recompute x offload x mbs


def test_each_mode_stores_its_subset(sweeps) -> None:
    out, results = sweeps
    every = _stored(out, "all")
    assert len(every) == small_space().num_points == results["all"].num_points
    expected = {
        "all": len(every),
        "valid": every.filter(pl.col("reason") == "").height,
        "fits": every.filter(pl.col("fits")).height,
        "best-per-layout": every.filter(pl.col("fits")).select(LAYOUT).unique().height,
    }
    assert 0 < expected["best-per-layout"] < expected["fits"] < expected["valid"] < len(every)
    for mode, count in expected.items():
        stored = _stored(out, mode)
        assert len(stored) == count == results[mode].extra["num_points_stored"], mode
        assert results[mode].extra["store"] == mode
        assert stored.select(CONFIG).unique().height == count  # no point twice
        # the search's result does not depend on what is stored
        assert _without_study(results[mode].best) == _without_study(results["all"].best)
        assert results[mode].top.drop("study").equals(results["all"].top.drop("study"))


def test_best_per_layout_keeps_each_layouts_best_point(sweeps) -> None:
    out, _ = sweeps
    stored = _stored(out, "best-per-layout")
    assert stored.select(LAYOUT).unique().height == len(stored)  # exactly one per layout
    keys = _sort_keys(("cost",))
    best = (
        _stored(out, "all")
        .filter(pl.col("fits"))
        .sort(keys, maintain_order=True)
        .unique(subset=list(LAYOUT), keep="first", maintain_order=True)
    )
    assert stored.sort(CONFIG).equals(best.sort(CONFIG))


def test_parts_say_what_they_hold(sweeps) -> None:
    out, _ = sweeps
    per_layout = points_per_layout(small_space())
    for mode in STORE_MODES:
        for part in sorted((out / "points" / f"study={mode}").glob("part-*.parquet")):
            meta = read_metadata(part)
            assert meta["trainmem_store"] == mode
            assert f"x{meta['trainmem_space_fingerprint']}-" in part.name
            assert (f"-{mode}-" in part.name) is (mode != "all")
            lo, hi = map(int, meta["trainmem_point_range"].split("-"))
            if mode == "best-per-layout":  # whole layouts per part
                assert lo % per_layout == 0 and (hi - lo) % per_layout == 0
            else:
                assert hi - lo == CHUNK or hi == small_space().num_points
    fingerprint = read_metadata(next((out / "points" / "study=all").glob("part-*")))
    assert fingerprint["trainmem_space_fingerprint"] == space_fingerprint(
        small_space(), chunk_size=CHUNK
    )


def test_a_rerun_skips_its_own_parts_and_another_mode_writes_its_own(sweeps, tmp_path) -> None:
    out, results = sweeps
    again = run_exhaustive(small_space(), out=out, study="fits", chunk_size=CHUNK, store="fits")
    assert again.extra["chunks_skipped"] == len(list((out / "points" / "study=fits").iterdir()))
    assert again.extra["num_points_stored"] == results["fits"].extra["num_points_stored"]
    assert again.best == results["fits"].best
    # --store all on a study that holds fits only: its own parts, the whole table
    full = run_exhaustive(small_space(), out=out, study="fits", chunk_size=CHUNK)
    assert full.extra["chunks_skipped"] == 0
    stored = _stored(out, "fits")
    assert len(stored) == small_space().num_points + results["fits"].extra["num_points_stored"]


def test_unknown_store_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="store: unknown value 'some'"):
        run_exhaustive(small_space(tiny=True), out=tmp_path, study="u", store="some")
