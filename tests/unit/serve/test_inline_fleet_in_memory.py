"""An inline fleet over HTTP is planned in memory: recommend_work writes no temporary fleet
file, and answers as the same fleet given as text does."""

from __future__ import annotations

import tempfile

import pytest

from trainmem.plan import RECOMMEND_OPTIONS, recommend_report
from trainmem.report import OUTPUT_FIELDS
from trainmem.serve._app import FILE_FIELDS
from trainmem.serve._work import fleet_tables, recommend_work

JOB = {"model": "gpt2", "seq_len": 1024, "global_batch_size": 32, "max_pp": 1, "max_cp": 1}
JOB = {**JOB, "precision": "mixed-fp16"}  # a T4 has no bf16 (its fleets' tests below)


def _request_fields() -> dict[str, object]:
    """The fields the /v1/recommend endpoint hands its worker (the body's, the server's dirs),
    the fleet taken out."""
    fields = {
        o.name: o.default
        for o in RECOMMEND_OPTIONS
        if o.http and o.name not in (*OUTPUT_FIELDS, *FILE_FIELDS, "fleet")
    }
    return {**fields, **JOB, "hardware_dir": None, "models_dir": None, "optimizers_dir": None}


@pytest.fixture
def no_temporary_files(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a temporary file was made")

    for name in ("TemporaryDirectory", "NamedTemporaryFile", "mkstemp", "mkdtemp"):
        monkeypatch.setattr(tempfile, name, refuse)


def test_inline_pools_need_no_file(no_temporary_files: None) -> None:
    pools = [{"gpu": "t4-16gb", "nodes": 1, "gpus_per_node": 2, "price_per_hour_usd": None}]
    answer = recommend_work(_request_fields(), pools=pools, label="2xt4-16gb", max_points=10**6)
    text = recommend_report(**{**_request_fields(), "fleet": "2xt4-16gb"})
    assert answer == text and answer["fleet"] == "2xt4-16gb" and answer["fits"]


def test_the_label_names_the_fleet_in_messages(no_temporary_files: None) -> None:
    pools = [{"gpu": "t4-16gb", "nodes": 1, "gpus_per_node": 2, "price_per_hour_usd": 0.25}]
    fields = {**_request_fields(), "model": "llama-3.1-70b"}
    answer = recommend_work(fields, pools=pools, label="2xt4-16gb@0.25/h", max_points=10**6)
    assert not answer["fits"] and answer["reason"].startswith("nothing fits on 2xt4-16gb@0.25/h")
    assert "[" not in answer["reason"]


def test_fleet_tables_are_the_toml_tables() -> None:
    pools = [
        {"gpu": "h100-sxm-80gb", "nodes": 2, "gpus_per_node": 8, "price_per_hour_usd": None},
        {"gpu": "a100-sxm-80gb", "nodes": 3, "gpus_per_node": 4, "price_per_hour_usd": 1.5},
    ]
    assert fleet_tables(pools) == [
        {"gpu": "h100-sxm-80gb", "nodes": 2, "gpus_per_node": 8},
        {"gpu": "a100-sxm-80gb", "nodes": 3, "gpus_per_node": 4, "price_per_hour_usd": 1.5},
    ]
