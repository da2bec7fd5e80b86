"""A sweep's Optuna study opens in optuna-dashboard (issue 16, item 5): the dashboard's own
WSGI app (the one `optuna-dashboard sqlite:///OUT/study.db` serves) lists the study, its
trials with their values and constraints, the metric name, and the best trial."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from trainmem.cli import main

optuna_dashboard = pytest.importorskip("optuna_dashboard")


def _get(app: Any, path: str) -> dict[str, Any]:
    status: list[str] = []
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "SERVER_NAME": "localhost",
        "SERVER_PORT": "8080",
        "wsgi.input": io.BytesIO(),
        "wsgi.url_scheme": "http",
    }
    body = b"".join(app(environ, lambda s, headers, exc=None: status.append(s)))
    assert status[0].startswith("200"), (path, status, body[:300])
    return json.loads(body)


def test_optuna_dashboard_opens_a_sweep_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    argv = ["sweep", "--model", "llama-3.2-1b", "--method", "optuna", "--trials", "30"]
    assert main([*argv, "--storage", storage, "--out", str(tmp_path / "o"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    app = optuna_dashboard.wsgi(storage)
    (summary,) = _get(app, "/api/studies")["study_summaries"]
    assert summary["study_name"] == result["study"]
    assert summary["directions"] == ["minimize"]
    study = _get(app, f"/api/studies/{summary['study_id']}")
    states = [t["state"] for t in study["trials"]]
    assert states.count("Complete") == 30
    assert set(states) <= {"Complete", "Fail"}  # Fail: a layout drawn again, not re-evaluated
    assert {p["name"] for p in study["trials"][0]["params"]} >= {"num_gpus", "tp", "pp", "cp"}
    best = study["best_trials"][0]
    assert best["values"][0] == pytest.approx(result["best"]["cost_per_million_tokens"])
    names = summary.get("metric_names") or study.get("metric_names") or study.get("objective_names")
    assert names == ["cost_per_million_tokens"], (summary, list(study))
