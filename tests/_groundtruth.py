"""Ground-truth cases (tests/data/groundtruth) expressed as estimator grids.

Shared by the golden tests and the bench scripts (bench/ imports tests/, never the reverse).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from trainmem.catalog import load_model
from trainmem.engine import estimate, make_grid, model_from_hf_config

GROUNDTRUTH_DIR = Path(__file__).resolve().parent / "data" / "groundtruth"
TRACED_FLAGS = ("micro_batch_size", "seq_len", "precision", "recompute", "optimizer", "attention")
"""The `training` keys of a recorded trace case that are estimate flags."""


def load_cases() -> list[dict[str, Any]]:
    """Every ground-truth case, in file-name order."""
    return [json.loads(p.read_text()) for p in sorted(GROUNDTRUTH_DIR.glob("*.json"))]


def case_grid(case: dict[str, Any]) -> dict[str, Any]:
    """The estimate flags that express one case (its README, "Multi-GPU cases")."""
    t = case["training"]
    cols: dict[str, Any] = {
        "micro_batch_size": t["micro_batch_size"],
        "seq_len": t["seq_len"],
        "num_gpus": t["num_gpus"],
        "precision": t["precision"],
        "optimizer": t["optimizer"],
        "recompute": t["recompute"],
        "attention": t["attention"],
        "framework": "hf",
    }
    if t.get("zero"):
        cols["zero"] = t["zero"]
    if t.get("tp"):
        cols["tp"] = t["tp"]
        cols["sequence_parallel"] = bool(t.get("sequence_parallel"))
    if t.get("pp"):
        cols["pp"] = t["pp"]
        cols["global_batch_size"] = t["global_batch_size"]
    return cols


def estimate_case(case: dict[str, Any]) -> dict[str, float]:
    """The estimate of one case (its `pp_rank` stage when it traces a non-worst stage)."""
    model = model_from_hf_config(case["model_config"], name=case["id"])
    stage = case["training"].get("pp_rank")  # a per-stage view of a non-worst rank
    out = estimate(model, make_grid(case_grid(case)), pp_stage=stage)
    return {k: float(np.asarray(v)[0]) for k, v in out.items() if k != "reason"}


def estimate_traced_case(case: dict[str, Any]) -> dict[str, float]:
    """The single-GPU estimate of a recorded trace case (tests/data/moe_cpu_trace.json,
    phi3_trace.json): its `model` preset or `model_config`, and its `training` flags."""
    t = case["training"]
    if "model" in case:
        model = load_model(case["model"])
    else:
        model = model_from_hf_config(case["model_config"], name=case["name"])
    out = estimate(model, make_grid(**{k: t[k] for k in TRACED_FLAGS}))
    return {k: float(np.asarray(v)[0]) for k, v in out.items() if k not in ("reason", "peak_phase")}
