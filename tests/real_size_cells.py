"""The stored real-size cells (tests/data/real_size_traces.json, made by
tests/data/make_real_size_traces.py) and the estimate each is compared with: shared by the golden
test (tests/golden/test_real_size_traces.py) and bench.conformance --real-size."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainmem.report import estimate_report

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "data" / "real_size_traces.json"
PRESETS = ROOT / "catalog" / "presets"


def load_traces(path: Path = TRACES) -> dict[str, Any]:
    """The stored file: {"provenance", "cells"}, each cell {"cell", "flags", "measured"}."""
    return dict(json.loads(path.read_text()))


def estimate_cell_report(flags: dict[str, Any]) -> dict[str, Any]:
    """The engine's report for a cell's flags (what `trainmem estimate --json` prints)."""
    return estimate_report(
        model=str(PRESETS / f"{flags['model']}.json"),
        gpu="h100-sxm-80gb",
        seq_len=flags["seq_len"],
        micro_batch_size=flags["micro_batch_size"],
        precision=flags["precision"],
        optimizer=flags["optimizer"],
        recompute=flags["recompute"],
        attention=flags["attention"],
        framework=flags["framework"],
        num_gpus=flags["num_gpus"],
        zero=flags["zero"],
        tp=1,
        sequence_parallel=False,
    )
