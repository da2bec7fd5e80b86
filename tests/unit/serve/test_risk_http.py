"""POST /v1/estimate and /v1/fit with a dataset inline (`lengths`, `lengths_histogram`): the
`risk` block as the CLI gives it; a path is no dataset over HTTP (422)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from trainmem.report import estimate_report  # noqa: E402
from trainmem.serve import create_app  # noqa: E402

JOB = {"model": "llama-2-7b", "zero": 3, "recompute": "none", "micro_batch_size": 4}


def test_inline_lengths_and_histogram_answer_as_the_cli():
    lengths = [100, 100, 700, 1500, 20, 2000, 3000]
    with TestClient(create_app()) as client:
        one = client.post("/v1/estimate", json={**JOB, "advice": False, "lengths": lengths})
        two = client.post(
            "/v1/estimate",
            json={
                **JOB,
                "advice": False,
                "lengths_histogram": [[100, 2], [700, 1], [1500, 1], [20, 1], [2000, 1], [3000, 1]],
            },
        )
        fit = client.post("/v1/fit", json={**JOB, "lengths": lengths, "max_micro_batch_size": 32})
        path = client.post("/v1/estimate", json={**JOB, "lengths": "/etc/passwd"})
    assert one.status_code == two.status_code == fit.status_code == 200
    want = estimate_report(
        {
            "num_gpus": 8,
            "precision": "mixed-bf16",
            **{k: v for k, v in JOB.items() if k != "model"},
        },
        model="llama-2-7b",
        advice=False,
        lengths=lengths,
    )["risk"]
    for got in (one.json()["risk"], two.json()["risk"]):
        assert {k: v for k, v in got.items() if k != "source"} == {
            k: v for k, v in want.items() if k != "source"
        }
    assert fit.json()["risk"]["within_risk"] is True
    assert path.status_code == 422


def test_contract_keys_at_the_top_level_and_absent_without_a_dataset():
    """Issue 28's keys (oom_probability, worst_step_peak_device_bytes, step_peak_quantiles)
    at the top level of both answers, equal to the `risk` block's; absent without lengths."""
    lengths = [100, 100, 700, 1500, 20, 2000, 3000]
    keys = ("oom_probability", "worst_step_peak_device_bytes", "step_peak_quantiles")
    with TestClient(create_app()) as client:
        est = client.post("/v1/estimate", json={**JOB, "advice": False, "lengths": lengths})
        fit = client.post("/v1/fit", json={**JOB, "lengths": lengths, "max_micro_batch_size": 32})
        bare = client.post("/v1/estimate", json={**JOB, "advice": False})
        bare_fit = client.post("/v1/fit", json={**JOB, "max_micro_batch_size": 32})
    for answer in (est.json(), fit.json()):
        assert all(answer[k] == answer["risk"][k] for k in keys)
        assert set(answer["step_peak_quantiles"]) == {"p50", "p99", "max"}
    for answer in (bare.json(), bare_fit.json()):
        assert not set(keys) & set(answer) and "risk" not in answer


def test_recommend_takes_the_dataset_inline_never_a_path():
    lengths = [100, 100, 700, 1500, 20, 2000, 3000]
    job = {"model": "llama-2-7b", "fleet": "8xh100-sxm-80gb", "seq_len": 2048}
    with TestClient(create_app()) as client:
        plan = client.post("/v1/recommend", json={**job, "lengths": lengths, "risk": 0.01})
        path = client.post("/v1/recommend", json={**job, "lengths": "/etc/passwd"})
        hist = client.post("/v1/recommend", json={**job, "lengths_histogram": "x.csv"})
    assert plan.status_code == 200, plan.text
    answer = plan.json()
    assert answer["fits"] and answer["oom_probability"] == 0.0
    assert set(answer["step_peak_quantiles"]) == {"p50", "p99", "max"}
    assert "--lengths" not in answer["estimate_command"]  # inline: no flag reproduces it
    assert path.status_code == hist.status_code == 422
