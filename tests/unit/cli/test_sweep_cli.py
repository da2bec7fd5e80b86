"""`trainmem fit`, `sweep` and `points`: JSON contracts and one-line errors."""

from __future__ import annotations

import json

import pytest

from trainmem.cli import main


def _json(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


SWEEP = [
    "sweep",
    "--model",
    "llama-3.2-1b",
    "--fleet",
    "8xa100-sxm-40gb",
    "--seq-len",
    "2048",
    "--global-batch-size",
    "32",
    "--max-pp",
    "4",
    "--max-cp",
    "1",
]


def test_sweep_json_and_points(capsys, tmp_path) -> None:
    out = _json(capsys, [*SWEEP, "--out", str(tmp_path), "--jobs", "1", "--json"])
    assert {"study", "method", "best", "num_points", "parquet", "elapsed_s"} <= set(out)
    best = out["best"]
    assert best["fits"] is True
    assert {
        "configuration",
        "cost_per_million_tokens",
        "step_time_s",
        "peak_device_bytes",
        "breakdown",
    } <= set(best)
    assert {
        "gpu",
        "num_gpus",
        "tp",
        "pp",
        "dp",
        "zero",
        "recompute",
        "micro_batch_size",
        "grad_accum_steps",
    } <= set(best["configuration"])
    rows = _json(
        capsys,
        [
            "points",
            str(tmp_path),
            "--where",
            "fits",
            "--sort",
            "cost_per_million_tokens",
            "--head",
            "3",
            "--json",
        ],
    )
    assert len(rows) == 3
    assert rows[0]["cost_per_million_tokens"] == pytest.approx(best["cost_per_million_tokens"])
    # byte columns are whole numbers: JSON integers (null where NaN), GiB in the human table
    byte_values = [v for row in rows for k, v in row.items() if k.endswith("_bytes")]
    assert byte_values and all(v is None or type(v) is int for v in byte_values)
    assert abs(rows[0]["peak_device_bytes"] - best["peak_device_bytes"]) <= 0.5
    assert main(["points", str(tmp_path), "--where", "fits", "--head", "3"]) == 0
    table = capsys.readouterr().out
    assert "peak_device_gib" in table and "peak_device_bytes" not in table
    assert "e10" not in table and "e+10" not in table
    # human output: a top-10 table
    assert main([*SWEEP, "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "points of llama-3.2-1b" in text and "$/Mtok" in text


def test_sweep_store_fits(capsys, tmp_path) -> None:
    """--store fits: the parts keep the fitting points only, and the outputs say so."""
    whole = _json(capsys, [*SWEEP, "--out", str(tmp_path / "all"), "--json"])
    assert whole["store"] == "all" and whole["num_points_stored"] == whole["num_points"]
    fits = _json(capsys, [*SWEEP, "--store", "fits", "--out", str(tmp_path / "f"), "--json"])
    assert fits["store"] == "fits" and 0 < fits["num_points_stored"] < fits["num_points"]
    assert fits["best"] == whole["best"]
    rows = _json(capsys, ["points", str(tmp_path / "f"), "--head", "100000", "--json"])
    assert len(rows) == fits["num_points_stored"] and all(r["fits"] for r in rows)
    assert main([*SWEEP, "--store", "fits", "--out", str(tmp_path / "f")]) == 0
    assert f"(stored: {fits['num_points_stored']:,} points, --store fits)" in (
        capsys.readouterr().out
    )


def test_sweep_optuna_and_pareto_json(capsys, tmp_path) -> None:
    out = _json(
        capsys, [*SWEEP, "--method", "optuna", "--trials", "12", "--out", str(tmp_path), "--json"]
    )
    assert out["complete_trials"] == 12 and out["storage"] == ":memory:"
    assert out["warm_start_trials"] == 8
    again = _json(
        capsys,
        [*SWEEP, "--method", "optuna", "--trials", "14", "--out", str(tmp_path), "--json"],
    )
    assert again["rebuilt_trials"] == 12 and again["complete_trials"] == 14
    cold = [*SWEEP, "--method", "optuna", "--trials", "4", "--no-warm-start", "--json"]
    assert _json(capsys, [*cold, "--out", str(tmp_path / "cold")])["warm_start_trials"] == 0
    pareto = _json(capsys, [*SWEEP, "--objective", "cost,time", "--out", str(tmp_path), "--json"])
    assert pareto["best"] is None and len(pareto["pareto"]) >= 1


def test_fit_json(capsys) -> None:
    out = _json(capsys, ["fit", "--model", "llama-3.2-1b", "--seq-len", "4096", "--json"])
    assert out["fits"] is True and out["max_micro_batch_size"] >= 1
    est = out["estimate"]
    assert est["config"]["micro_batch_size"] == out["max_micro_batch_size"]
    assert est["fits"] is True
    bigger = _json(
        capsys,
        [
            "estimate",
            "--model",
            "llama-3.2-1b",
            "--seq-len",
            "4096",
            "--micro-batch-size",
            str(out["max_micro_batch_size"] + 1),
            "--json",
        ],
    )
    assert bigger["fits"] is False
    argv = [
        "fit",
        "--model",
        "llama-3.1-8b",
        "--zero",
        "3",
        "--recompute",
        "full",
        "--precision",
        "mixed-bf16",
        "--minimize",
        "num-gpus",
        "--json",
    ]
    few = _json(capsys, argv)
    assert few["min_num_gpus"] > 1 and few["estimate"]["fits"] is True
    n = few["min_num_gpus"] - 1
    fewer = _json(capsys, ["estimate", *argv[1:9], "--num-gpus", str(n), "--json"])
    assert fewer["fits"] is False


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "--method", "grid"],
        ["sweep", "--objective", "speed"],
        ["sweep", "--fleet", "12xh100-sxm-80gb"],
        ["sweep", "--global-batch-size", "0"],
        ["fit", "--minimize", "tp"],
        ["sweep", "--workers", "2"],
        ["sweep", "--method", "optuna", "--jobs", "2"],
        ["sweep", "--store", "some"],
        ["sweep", "--method", "optuna", "--store", "fits"],
        ["points", "/nonexistent-folder"],
    ],
)
def test_bad_input_is_one_line_exit_2(argv, capsys, tmp_path) -> None:
    assert main([*argv, "--out", str(tmp_path)] if argv[0] == "sweep" else argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_gpus_json_and_table_show_aliases(capsys) -> None:
    assert main(["gpus", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["h100-sxm-80gb"]["aliases"] == ["h100"]
    assert rows["h100-pcie-80gb"]["aliases"] == []
    assert main(["gpus"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("aliases")
    assert any(
        line.startswith("rtx-4090-24gb") and line.endswith("rtx4090, rtx-4090, 4090")
        for line in lines
    )


NOTHING_FITS = ["fit", "--model", "llama-3.1-70b", "--gpu", "h100", "--num-gpus", "8"]


def test_fit_nothing_fits_says_the_closest_peak_and_the_shortfall(capsys) -> None:
    out = _json(capsys, [*NOTHING_FITS, "--json"])
    assert out["fits"] is False and out["max_micro_batch_size"] is None
    peak, short = out["closest_peak_device_bytes"], out["shortfall_bytes"]
    assert isinstance(peak, int) and isinstance(short, int) and short > 0
    est = out["estimate"]
    assert est["config"]["micro_batch_size"] == 1 and est["peak_device_bytes"] == peak
    limit = peak - short
    assert abs(limit - est["gpu"]["usable_bytes"] * (1 - est["headroom"])) <= 1
    assert main(NOTHING_FITS) == 0
    first = capsys.readouterr().out.splitlines()[0]
    gib = 1024**3
    assert first == (
        f"nothing fits on h100-sxm-80gb: micro-batch 1 needs {peak / gib:.2f} GiB, "
        f"{short / gib:.2f} GiB over the {limit / gib:.2f} GiB limit (79.19 usable, 10% headroom)"
    )


def test_fit_that_fits_has_no_shortfall_keys(capsys) -> None:
    out = _json(capsys, ["fit", "--model", "llama-3.2-1b", "--json"])
    assert out["fits"] is True
    assert "shortfall_bytes" not in out and "closest_peak_device_bytes" not in out
