"""`sweep --lengths` (issue 28 item 1): the risk over a dataset as a constraint. Every point's
risk columns equal `estimate --lengths` for that point; a point fits only within --risk."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from trainmem.engine import FIELD_NAMES
from trainmem.report import estimate_report
from trainmem.results import SCHEMA_VERSION, query_points, read_metadata, write_points
from trainmem.results._schema import READ_SCHEMA
from trainmem.results._store import points_frame
from trainmem.sweep import run_sweep, sweep_report

DATASET = "tests/data/lengths/alpaca_eval_gpt4_llama2_lengths.csv"
PINNED = {"num_gpus": 8, "tp": 2, "pp": 1, "virtual_stages": 1, "ep": 1, "offload": "none"}
"""A small space (ZeRO, recompute, cp, micro-batch: some 100 points)."""


def _sweep(batching: str, **extra):
    return run_sweep(
        model="llama-2-7b",
        fleet="8xh100-sxm-80gb",
        seq_len=2048,
        out=None,
        store="all",
        max_micro_batch_size=8,
        max_cp=2,
        lengths_histogram=DATASET,
        batching=batching,
        **PINNED,
        **extra,
    )


def _points(batching: str) -> pl.DataFrame:
    """Every point of the small sweep (its evaluated columns, as the parts store them)."""
    from trainmem.sweep._points import _frame

    done = _sweep(batching)
    space = done.space
    frame = _frame(space, space.evaluate(np.arange(space.num_points)), study="t")
    return frame.with_columns(pl.col(pl.Categorical).cast(pl.String))


@pytest.mark.parametrize("batching", ["pad-longest", "packed", "bucketed"])
def test_every_point_equals_estimate_with_lengths(batching: str) -> None:
    frame = _points(batching)
    valid = frame.filter(pl.col("reason") == "")
    assert 10 <= len(valid) <= 400
    assert frame.filter(pl.col("reason") != "")["oom_probability"].null_count() == (
        len(frame) - len(valid)
    )
    seen = set()
    for row in valid.iter_rows(named=True):  # the test's oracle: one estimate per point
        fields = {k: row[k] for k in FIELD_NAMES}
        report = estimate_report(
            model="llama-2-7b",
            gpu=row["gpu"],
            advice=False,
            lengths_histogram=DATASET,
            batching=batching,
            **fields,
        )
        risk = report["risk"]
        got = (
            row["oom_probability"],
            row["worst_step_peak_device_bytes"],
            row["step_peak_p50_device_bytes"],
            row["step_peak_p99_device_bytes"],
        )
        want = (
            risk["oom_probability"],
            risk["worst_step_peak_device_bytes"],
            risk["step_peak_quantiles"]["p50"],
            risk["step_peak_quantiles"]["p99"],
        )
        assert got == want, (row["micro_batch_size"], row["tp"], row["cp"], row["zero"])
        assert row["fits"] == risk["within_risk"]  # the load fits on every point here
        seen.add(risk["oom_probability"])
    assert seen == {0.0, 1.0}  # the space holds points on both sides of the limit


def test_fits_is_the_risk_constraint_not_the_seq_len_peak() -> None:
    """Over the dataset (805 sequences, the longest 1661 tokens), micro-batch 5 fits where
    seq 2048 does not (docs/risk.md's table); the best point fits with oom_probability 0."""
    frame = _points("pad-longest")
    valid = frame.filter(pl.col("reason") == "")
    limit = 80 * 2**30  # any H100's usable memory is below this; fits means within it
    gained = valid.filter(pl.col("fits") & (pl.col("peak_device_bytes") > 0.9 * limit))
    assert len(gained)  # fits over the dataset although the seq_len peak would not
    fitting = valid.filter(pl.col("fits"))
    assert (fitting["oom_probability"] == 0.0).all()
    assert (valid.filter(pl.col("oom_probability") > 0.001)["fits"].not_()).all()


def test_risk_one_admits_every_point_the_load_fits() -> None:
    frame_strict = _points("pad-longest")
    done = _sweep("pad-longest", risk=1.0)
    space = done.space
    from trainmem.sweep._points import _frame

    loose = _frame(space, space.evaluate(np.arange(space.num_points)), study="t")
    assert loose["fits"].sum() >= frame_strict["fits"].sum()
    assert loose["fits"].sum() == (loose["reason"].cast(pl.String) == "").sum()


def test_json_and_parquet_carry_the_risk(tmp_path) -> None:
    report = sweep_report(
        model="llama-2-7b",
        fleet="8xh100-sxm-80gb",
        seq_len=2048,
        out=str(tmp_path),
        max_micro_batch_size=8,
        max_cp=2,
        lengths_histogram=DATASET,
        **PINNED,
    )
    best = report["best"]
    assert best["oom_probability"] == 0.0
    q = best["step_peak_quantiles"]
    assert q["p50"] <= q["p99"] <= q["max"] == best["worst_step_peak_device_bytes"]
    assert "-risk0.001-pad-longest-" in report["study"]
    json.dumps(report)
    points = query_points(report["parquet"], head=None)
    assert {"oom_probability", "worst_step_peak_device_bytes"} <= set(points.columns)
    assert points.filter(pl.col("fits"))["oom_probability"].max() == 0.0


def test_without_a_dataset_the_risk_columns_are_null_and_json_unchanged() -> None:
    report = sweep_report(
        model="llama-2-7b", fleet="8xh100-sxm-80gb", seq_len=2048, out=None, **PINNED
    )
    assert "oom_probability" not in report["best"]
    assert report["top"][0].keys() == report["best"].keys()


def test_schema_6_parts_read_beside_schema_7(tmp_path) -> None:
    """A part written before the risk columns (schema 6) reads with them null, alone or with
    schema-7 parts (schema 8 only added the vision-language training fields)."""
    assert SCHEMA_VERSION == 8
    n = 3
    cols = {
        "gpu": np.array(["h100-sxm-80gb"] * n, dtype=object),
        "num_gpus": np.arange(1, n + 1),
        "fits": np.ones(n, dtype=bool),
        "reason": np.array([""] * n, dtype=object),
        "study": "s",
        "oom_probability": np.array([0.0, 1.0, np.nan]),
        "worst_step_peak_device_bytes": np.array([1.0, 2.0, np.nan]),
    }
    write_points(points_frame(cols), tmp_path, study="new", part="a")
    old = write_points(points_frame(cols), tmp_path, study="old", part="a")
    meta = {k: v for k, v in pl.read_parquet_metadata(old).items() if k.startswith("trainmem_")}
    meta["trainmem_schema_version"] = "6"
    risk = ["oom_probability", "worst_step_peak_device_bytes"]
    risk += ["step_peak_p50_device_bytes", "step_peak_p99_device_bytes"]
    pl.read_parquet(old).drop(risk).write_parquet(old, metadata=meta)
    assert read_metadata(old)["trainmem_schema_version"] == "6"
    alone = query_points(tmp_path / "points" / "study=old", head=None)
    assert dict(alone.schema) == dict(READ_SCHEMA)
    assert alone["oom_probability"].null_count() == n
    both = query_points(tmp_path, head=None)
    assert dict(both.schema) == dict(READ_SCHEMA) and len(both) == 2 * n
    assert sorted(both["worst_step_peak_device_bytes"].drop_nulls().to_list()) == [1, 2]


def test_optuna_and_recommend_take_the_constraint(tmp_path) -> None:
    """Both share the sweep's evaluation (`evaluate_columns`): their answers fit within the
    risk and carry issue 28's keys."""
    from trainmem.plan import recommend_report

    common = dict(model="llama-2-7b", fleet="8xh100-sxm-80gb", seq_len=2048, max_micro_batch_size=8)
    tuned = sweep_report(
        **common, method="optuna", trials=30, out=str(tmp_path), lengths_histogram=DATASET
    )
    assert tuned["best"]["oom_probability"] == 0.0
    plan = recommend_report(**common, lengths_histogram=DATASET)
    assert plan["fits"] and plan["oom_probability"] == 0.0
    assert plan["micro_batch_size"] == 4  # 2 at seq 2048 without the dataset
    assert plan["step_peak_quantiles"]["max"] == plan["worst_step_peak_device_bytes"]
    assert "--lengths-histogram" in plan["estimate_command"]
    assert "oom_probability" not in recommend_report(**common)


SMALL = ["--model", "llama-3.2-1b", "--fleet", "8xa100-sxm-40gb", "--max-pp", "2"]


@pytest.mark.parametrize(
    ("argv", "starts"),
    [
        (["--batching", "longest"], "error: batching: unknown value 'longest'; allowed: "),
        (["--risk", "1.5"], "error: risk: must be in [0, 1], got 1.5"),
        (["--lengths", "no-such.csv"], "error: lengths: no-such.csv: no such file"),
        (["--lengths", "README.md"], "error: lengths: README.md: entry 1 is"),
        (["--batching", "bucketed", "--buckets", "8,x"], "error: buckets: expected comma-"),
        (["--lengths", "a.csv", "--lengths-histogram", "b.csv"], "error: lengths: give"),
    ],
)
@pytest.mark.parametrize("command", ["sweep", "recommend"])
def test_bad_risk_options_are_one_line_exit_2(capsys, tmp_path, command, argv, starts) -> None:
    from trainmem.cli import main

    out = ["--out", str(tmp_path / "out")] if command == "sweep" else []
    assert main([command, *SMALL, *argv, *out]) == 2
    err = capsys.readouterr().err
    assert err.startswith(starts) and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_optuna_constraint_is_the_worst_steps_distance(tmp_path) -> None:
    """A point over the risk is told how far its worst step is over the limit (GiB), live and
    when the study is rebuilt from its points."""
    from trainmem.sweep._optuna import _constraint

    frame = _points("pad-longest")
    over = frame.filter((pl.col("reason") == "") & (pl.col("oom_probability") == 1.0))
    res = {
        k: over[k].cast(pl.Float64).to_numpy()
        for k in ("peak_device_bytes", "worst_step_peak_device_bytes")
    }
    res["reason"] = np.zeros(len(over), dtype=np.int16)
    res["fits"] = over["fits"].to_numpy()
    limit = 79.19 * 2**30 * 0.9  # not needed exactly: headroom_bytes carries it
    res["headroom_bytes"] = np.full(len(over), limit) - res["peak_device_bytes"]
    got = _constraint(res)
    want = np.clip((res["worst_step_peak_device_bytes"] - limit) / 2**30, 1e-3, 1000)
    assert len(over) and np.allclose(got, want) and (got > 0).all()
    rerun = [
        sweep_report(
            model="llama-2-7b",
            fleet="8xh100-sxm-80gb",
            seq_len=2048,
            method="optuna",
            trials=12,
            out=str(tmp_path),
            max_micro_batch_size=8,
            lengths_histogram=DATASET,
        )["best"]
        for _ in range(2)
    ]  # the second run rebuilds the study from the first's points and continues it
    assert rerun[0]["oom_probability"] == rerun[1]["oom_probability"] == 0.0
