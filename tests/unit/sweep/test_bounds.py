"""Bounded searches: an Optuna study never evaluates one layout twice and ends once every
layout is stored (`--trials` above the space's layouts is clamped, with a note); each search
refuses a size above its documented cap in one line, before anything is written."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import polars as pl
import pytest

from trainmem.cli import main
from trainmem.sweep import _bounds
from trainmem.sweep._bounds import bounded_trials, layout_key, num_layouts, unseen_layout
from trainmem.sweep._exhaustive import run_exhaustive
from trainmem.sweep._optuna import run_optuna

sys.path.insert(0, str(Path(__file__).parent))
from test_search import small_space  # noqa: E402

LAYOUT = ["gpu", *[a for a in _bounds.OUTER_AXES if a != "pool"]]


def _stored(out: Path, study: str = "o") -> pl.DataFrame:
    return pl.read_parquet(sorted((out / "points" / f"study={study}").glob("part-*.parquet")))


@pytest.mark.parametrize("objective", [("cost",), ("cost", "time")])
def test_optuna_never_evaluates_a_layout_twice(tmp_path, objective) -> None:
    space = small_space()
    result = run_optuna(space, out=tmp_path, study="o", trials=40, seed=0, objectives=objective)
    stored = _stored(tmp_path)
    assert result.extra["complete_trials"] == 40
    assert stored["trial"].n_unique() == 40
    assert stored.select(LAYOUT).unique().height == 40  # one trial per layout
    assert stored.select("trial", *LAYOUT).unique().height == 40


def test_trials_above_the_layouts_are_clamped_and_the_study_ends(tmp_path, capsys) -> None:
    space = small_space(tiny=True)
    layouts = num_layouts(space)
    start = time.monotonic()
    result = run_optuna(space, out=tmp_path, study="o", trials=100_000, seed=0)
    assert time.monotonic() - start < 60
    assert result.extra["complete_trials"] == layouts == 32
    assert _stored(tmp_path).select(LAYOUT).unique().height == layouts
    assert result.num_points == space.num_points  # every point, once
    err = capsys.readouterr().err
    assert f"note: trials: the space has {layouts} layouts; --trials 100,000 clamped to" in err
    again = run_optuna(space, out=tmp_path, study="o", trials=100_000, seed=0)
    assert again.extra["complete_trials"] == layouts and again.num_points == space.num_points


def test_unseen_layout_finds_the_last_one() -> None:
    import numpy as np

    space = small_space(tiny=True)
    rng = np.random.default_rng(0)
    every = []
    seen: set = set()
    for _ in range(num_layouts(space)):
        params = unseen_layout(space, seen, rng=rng)
        assert params is not None
        seen.add(layout_key(params))
        every.append(params)
    assert len(seen) == num_layouts(space)
    assert unseen_layout(space, seen, rng=rng) is None


def test_caps_are_one_line_before_anything_is_written(tmp_path, monkeypatch, capsys) -> None:
    space = small_space()
    monkeypatch.setattr(_bounds, "MAX_TRIALS", 10)
    with pytest.raises(ValueError, match=r"^trials: must be <= 10 \(an Optuna study's cap\)"):
        bounded_trials(space, 11)
    monkeypatch.setattr(_bounds, "MAX_POINTS", 100)
    with pytest.raises(ValueError, match=r"^space: 3,888 points exceed the exhaustive search's"):
        run_exhaustive(space, out=tmp_path / "x", study="x")
    out = tmp_path / "cli"
    argv = ["sweep", "--model", "llama-3.2-1b", "--fleet", "8xa100-sxm-40gb", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: space: ") and err.count("\n") == 1
    assert main([*argv, "--method", "optuna", "--trials", "11"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: trials: must be <= 10") and err.count("\n") == 1
    assert not out.exists()
