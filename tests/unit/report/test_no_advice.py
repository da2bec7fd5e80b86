"""`advice=False` (`estimate --no-advice`, `"advice": false` over HTTP): the same report without
the search of changes that make the job fit (issue 27 item 7: the advice is ~95% of one
report's time, so a loop over many jobs asks for it only where it wants it)."""

from __future__ import annotations

import json

import pytest

import trainmem
from trainmem.cli import main

JOB = dict(
    model="llama-3.1-8b",
    gpu="h100-sxm-80gb",
    num_gpus=8,
    zero=3,
    precision="mixed-bf16",
    recompute="full",
    micro_batch_size=4,
    seq_len=8192,
)
"""Does not fit (86.55 GiB on an 80 GB card, the API docstring's job): the advice is not empty."""
ARGV = [
    "estimate",
    "--model",
    "llama-3.1-8b",
    "--num-gpus",
    "8",
    "--zero",
    "3",
    "--precision",
    "mixed-bf16",
    "--recompute",
    "full",
    "--micro-batch-size",
    "4",
    "--seq-len",
    "8192",
]


def test_the_report_without_advice_is_the_report_less_its_advice() -> None:
    full = trainmem.estimate(**JOB)
    fast = trainmem.estimate(**JOB, advice=False)
    assert not full["fits"] and full["advice"]
    assert set(full) - set(fast) == {"advice"}
    assert set(fast) <= set(full)
    assert {k: full[k] for k in fast} == fast
    assert fast["top_consumers"] == full["top_consumers"]


def test_cli_no_advice_prints_the_consumers_not_the_changes(capsys) -> None:
    assert main(ARGV) == 0
    full = capsys.readouterr().out
    assert main([*ARGV, "--no-advice"]) == 0
    fast = capsys.readouterr().out
    assert "changes that make it fit" in full and "changes that make it fit" not in fast
    assert "it fits as it is on" not in fast
    assert "top memory consumers at the peak:" in fast
    assert "DOES NOT FIT" in fast
    # Everything before the advice is the same, line for line.
    head = full.split("\n  changes that make it fit")[0]
    assert fast.startswith(head)


def test_cli_json_no_advice_has_no_advice_key(capsys) -> None:
    assert main([*ARGV, "--json", "--no-advice"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "advice" not in report and report["top_consumers"]
    assert main([*ARGV, "--json", "--advice"]) == 0  # the explicit default
    assert json.loads(capsys.readouterr().out)["advice"]


def test_check_fix_searches_the_advice_even_under_no_advice() -> None:
    """--fix picks its edit among the advice's changes: it asks for them whatever the flag."""
    files = {
        "ds.json": json.dumps({"train_micro_batch_size_per_gpu": 16, "bf16": {"enabled": True}})
    }
    plain = trainmem.check(files, model="llama-3.1-8b", fix=True)
    fast = trainmem.check(files, model="llama-3.1-8b", fix=True, advice=False)
    assert not plain["fits"]
    assert plain["fix"] == fast["fix"] and plain["fix"] is not None
    assert fast["advice"] == plain["advice"]


def test_http_advice_false() -> None:
    pytest.importorskip("fastapi", reason="trainmem[serve] not installed")
    from fastapi.testclient import TestClient

    from trainmem.serve._app import create_app

    body = {k: v for k, v in JOB.items()}
    with TestClient(create_app()) as client:
        full = client.post("/v1/estimate", json=body).json()
        fast = client.post("/v1/estimate", json={**body, "advice": False}).json()
    assert full["advice"] and "advice" not in fast
    assert {k: full[k] for k in fast} == fast
