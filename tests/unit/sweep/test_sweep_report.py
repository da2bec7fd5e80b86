"""`trainmem.sweep(...)` returns what `trainmem sweep --json` prints: one verb (sweep_report)
under both faces, so the CLI only parses, calls and prints."""

from __future__ import annotations

import json
from pathlib import Path

import trainmem
from trainmem.cli import main

JOB = {
    "model": "gpt2",
    "fleet": "2xt4-16gb",
    "seq_len": 1024,
    "global_batch_size": 32,
    "max_pp": 1,
    "max_cp": 1,
    "max_micro_batch_size": 4,
}


def _argv(job: dict[str, object], out: Path) -> list[str]:
    flags = [(f"--{k.replace('_', '-')}", str(v)) for k, v in job.items()]
    return ["sweep", *(part for pair in flags for part in pair), "--out", str(out), "--json"]


def _same_but_time(api: dict, cli: dict, api_out: Path, cli_out: Path) -> None:
    """Equal key for key, in the same order; `elapsed_s` is a wall-clock time (both have it, a
    number) and `parquet` names each run's own folder."""
    assert list(api) == list(cli)
    assert isinstance(api["elapsed_s"], float) and isinstance(cli["elapsed_s"], float)
    assert api["parquet"].replace(str(api_out), "<OUT>") == cli["parquet"].replace(
        str(cli_out), "<OUT>"
    )
    drop = ("elapsed_s", "parquet")
    assert {k: v for k, v in api.items() if k not in drop} == {
        k: v for k, v in cli.items() if k not in drop
    }


def test_the_api_returns_what_the_cli_prints(tmp_path: Path, capsys) -> None:
    assert main(_argv(JOB, tmp_path / "cli")) == 0
    cli = json.loads(capsys.readouterr().out)
    report = trainmem.sweep(**JOB, out=str(tmp_path / "api"))
    assert type(report) is not dict and isinstance(report, dict)
    _same_but_time(dict(report), cli, tmp_path / "api", tmp_path / "cli")
    assert json.loads(json.dumps(report)) == dict(report)  # JSON-able as it is
    # The SweepRun's attributes (the earlier return contract) are still there.
    assert report.result.num_points == cli["num_points"]
    assert report.study == cli["study"] and list(report.objectives) == cli["objective"]
    assert report.method == "exhaustive" and report.space.model.name == "gpt2"


def test_a_pareto_front_and_an_unset_out(tmp_path: Path, capsys) -> None:
    """Two objectives (the `pareto` key), and out=None (in memory: no folder is checked)."""
    job = {**JOB, "objective": "cost,time"}
    assert main(_argv(job, tmp_path / "cli")) == 0
    cli = json.loads(capsys.readouterr().out)
    report = trainmem.sweep(**job, out=str(tmp_path / "api"))
    _same_but_time(dict(report), cli, tmp_path / "api", tmp_path / "cli")
    assert "pareto" in report and report["best"] is None
    in_memory = trainmem.sweep(**JOB, out=None)
    assert in_memory["parquet"] == "" and in_memory["num_points"] == cli["num_points"]
