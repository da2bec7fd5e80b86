"""Optuna storages: several worker processes on one study (SQLite), and PostgreSQL for real."""

from __future__ import annotations

import os
import uuid

import polars as pl
import pytest

from trainmem.catalog import load_model
from trainmem.hardware import load_gpus, parse_fleet
from trainmem.sweep._optuna import run_optuna
from trainmem.sweep._space import make_space

GPUS = load_gpus()
POSTGRES_ENV = "TRAINMEM_TEST_POSTGRES_URL"


def _space():
    return make_space(
        load_model("llama-3.2-1b"),
        parse_fleet("8xa100-sxm-40gb", GPUS),
        GPUS,
        seq_len=2048,
        global_batch_size=32,
        max_pp=4,
        max_cp=1,
    )


def _check(result, out, study: str, trials: int) -> None:
    assert result.extra["complete_trials"] == trials  # the workers never overshoot the total
    frame = pl.read_parquet(sorted((out / "points" / f"study={study}").glob("part-*.parquet")))
    keys = ["trial", "zero", "recompute", "offload", "micro_batch_size"]
    assert frame.select(keys).unique().height == len(frame)  # no point written twice
    assert frame["trial"].n_unique() == trials
    # Which layouts the two workers' samplers draw depends on their interleaving; 29% of this
    # space's layouts have a fitting point, so 8 trials find none ~6% of the time.
    assert bool(result.best) == bool(frame["fits"].any())
    assert all(row["fits"] for row in result.best)


def test_two_worker_processes_share_one_sqlite_study(tmp_path) -> None:
    result = run_optuna(
        _space(), out=tmp_path, study="w", trials=8, seed=0, workers=2, batch_size=2
    )
    _check(result, tmp_path, "w", 8)


def test_postgresql_storage(tmp_path) -> None:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"{POSTGRES_ENV} is not set: no PostgreSQL server (.ci/run starts one)")
    pytest.importorskip("psycopg", reason="psycopg (the test extra) is not installed")
    study = f"pg-{uuid.uuid4().hex[:8]}"
    first = run_optuna(
        _space(), out=tmp_path, study=study, trials=4, seed=0, storage=url, workers=2, batch_size=2
    )
    _check(first, tmp_path, study, 4)
    # A second "machine" (another output folder) continues the same study to its total.
    other = tmp_path / "machine2"
    second = run_optuna(_space(), out=other, study=study, trials=8, seed=1, storage=url)
    assert second.extra["complete_trials"] == 8
