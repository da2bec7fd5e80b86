"""The published real-GPU cases stay consistent with the records they come from.

tests/data/published/framework_cases.json turns records of framework_measurements.json (each with
its source, verbatim row and trust) into trainmem flags; tests/framework_accuracy.py prints their
errors. Checked here without running the engine: every case names a record that exists, its
measured figure is the record's in GiB, its metric is one the accuracy table knows, a fit case
says what happened, a model given as a config.json exists with its `_source`, and the records
added for the fine-tuning stacks say what they inferred.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.framework_accuracy import METRIC_KEYS

PUBLISHED = Path(__file__).resolve().parent / "data" / "published"
RECORDS: list[dict[str, Any]] = json.loads((PUBLISHED / "framework_measurements.json").read_text())
CASES: list[dict[str, Any]] = json.loads((PUBLISHED / "framework_cases.json").read_text())["cases"]
METRICS = {*METRIC_KEYS, "allocated", "active"}
FIRST_STACK_RECORD = 64
"""Records from here on were added for issue 26 (LitGPT, HF, DeepSpeed tutorials, QLoRA)."""


def _numbers(value: Any) -> list[float]:
    """Every figure a record's memory_value holds (a number or a dict of them)."""
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, dict):
        return [float(v) for v in value.values() if isinstance(v, (int, float))]
    return []


def test_records_are_numbered_by_position() -> None:
    assert [r["id"] for r in RECORDS] == list(range(len(RECORDS)))


def test_case_ids_are_unique() -> None:
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_case_matches_its_record(case: dict[str, Any]) -> None:
    assert case["metric"] in METRICS
    assert case["trust"] in {"high", "medium", "low"}
    assert isinstance(case["modelled"], bool)
    assert case["modelled"] or case.get("not_modelled"), "say which knob is not modelled"
    if case["metric"] == "fit":
        assert case["outcome"] in {"ran", "oom"} and case.get("source")
        assert "measured_gib" not in case
    else:
        assert case["measured_gib"] > 0
    if "record" not in case:
        return
    record = RECORDS[case["record"]]
    if case["metric"] == "fit":
        return
    # The record's figure in its own unit: GiB, decimal GB, MiB, bytes, or int-truncated GiB.
    measured = case["measured_gib"]
    candidates = [
        c
        for n in _numbers(record["memory_value"])
        for c in (n, n * 1e9 / 2**30, n / 1024, n / 2**30, n + 0.5)
    ]
    assert any(abs(c - measured) <= 0.005 * max(measured, 1.0) for c in candidates), (
        f"{case['id']}: {measured} GiB is not record {case['record']}'s {record['memory_value']}"
    )


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_case_model_config_exists(case: dict[str, Any]) -> None:
    model = case["flags"].get("model", "")
    if not model.endswith(".json"):
        return
    config = json.loads((PUBLISHED / model).read_text())
    assert config.get("_source"), f"{model}: say where the dimensions come from"


@pytest.mark.parametrize("record", RECORDS[FIRST_STACK_RECORD:], ids=lambda r: str(r["id"]))
def test_stack_records_state_source_and_inferences(record: dict[str, Any]) -> None:
    assert record["source"].startswith("http")
    assert record["verbatim"].strip()
    assert record["trust"] in {"high", "medium", "low"} and record["trust_note"]
    assert isinstance(record["inferred"], list) and record["inferred"]
