"""Published (and measured-here) training throughput as estimator rows, and the README's table.

tests/data/step_time_published.json holds the rows with their sources; tests/golden/
test_step_time_papers.py checks the predictions against them and the README's table against
markdown(). `python -m bench.calibrate_time` prints them, refits the fitted constants (--fit) and
writes the table (--update-readme).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainmem.catalog import load_model
from trainmem.engine import TimeParams, estimate_time, make_grid, model_from_hf_config, time_inputs
from trainmem.hardware import get_gpu

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "step_time_published.json"
MEASURED = ROOT / "tests" / "data" / "h200_step_time.json"
"""Single-GPU steps timed here (bench/gpu_step_time.py), a "validation" table."""
README = ROOT / "README.md"
BEGIN, END = "<!-- step-time:begin -->", "<!-- step-time:end -->"
"""The markers the table sits between in README.md."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One published measurement, ready to estimate."""

    table: str
    use: str
    id: str
    metric: str
    published: float
    model: Any
    grid: dict[str, np.ndarray]
    gpu: str


def load_rows(path: Path = DATA, measured: Path | None = MEASURED) -> list[Row]:
    """Every row of every table, with the table's grid fields under the row's own."""
    tables = json.loads(path.read_text())["tables"]
    if measured is not None:
        tables = [*tables, _measured_table(json.loads(measured.read_text()))]
    rows = []
    for table in tables:
        for r in table["rows"]:
            spec = r["model"]
            model = (
                load_model(spec)
                if isinstance(spec, str)
                else model_from_hf_config(spec, name=r["id"])
            )
            rows.append(
                Row(
                    table=table["name"],
                    use=table["use"],
                    id=r["id"],
                    metric=table["metric"],
                    published=float(r["published"]),
                    model=model,
                    grid=make_grid({**table["grid"], **r["grid"]}),
                    gpu=table["gpu"],
                )
            )
    return rows


def _measured_table(doc: dict[str, Any]) -> dict[str, Any]:
    """bench/gpu_step_time.py's output as a table of this file's shape (one GPU each)."""
    keys = ("micro_batch_size", "seq_len", "precision", "recompute")
    return {
        "name": "measured_h200",
        "use": "validation",
        "gpu": "h200-sxm-141gb",
        "metric": "tokens_per_second_per_gpu",
        "grid": {"framework": "hf"},
        "rows": [
            {
                "id": f"{c['model']}-{c['precision']}-{c['recompute']}-b{c['micro_batch_size']}"
                f"-s{c['seq_len']}",
                "model": c["model"],
                "grid": {k: c[k] for k in keys},
                "published": c["tokens_per_second"],
            }
            for c in doc["cases"]
        ],
    }


def predict(rows: list[Row], params: TimeParams | None = None) -> np.ndarray:
    """The predicted value of each row's metric."""
    out = []
    for row in rows:
        timing = estimate_time(row.model, row.grid, **time_inputs(get_gpu(row.gpu)), params=params)
        out.append(float(timing[row.metric][0]))
    return np.array(out)


def markdown(rows: list[Row], predicted: np.ndarray) -> str:
    """Per-table error summary (the README table)."""
    lines = [
        "| table | use | rows | mean error | max abs error | within 30% |",
        "|---|---|---:|---:|---:|---:|",
    ]
    errors = predicted / np.array([r.published for r in rows]) - 1.0
    for name in dict.fromkeys(r.table for r in rows):
        idx = [i for i, r in enumerate(rows) if r.table == name]
        e = errors[idx]
        lines.append(
            f"| {name} | {rows[idx[0]].use} | {len(idx)} | {np.mean(e):+.1%} | "
            f"{np.max(np.abs(e)):.1%} | {np.sum(np.abs(e) <= 0.30)}/{len(idx)} |"
        )
    return "\n".join(lines)
