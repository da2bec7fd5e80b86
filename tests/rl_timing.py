"""verl's own timing logs (tests/data/published/rl_timing.json) beside the RL step's time terms
(engine/_rl_time.py), for tests/unit/engine/test_rl_time.py and `python -m bench.rl_time`.

Each case of tests/data/published/rl_timing.json (a verl run's median `timing_s/*` over its
log's steps, with the trainmem fields of its script): the estimate's rollout, score (old
policy + reference + critic values), actor update and critic update per rollout step, the
measured value and the ratio. The rollout is estimated at response_len (every response at its
longest: the bound); `at max` rescales it to the longest response the log printed, which is
what a wave actually waits for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from trainmem.catalog import load_model
from trainmem.engine import estimate_time, make_grid, time_inputs
from trainmem.engine._rl_time import optimizer_steps_per_rollout
from trainmem.hardware import get_gpu

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "published" / "rl_timing.json"


def case_terms(case: dict[str, Any]) -> dict[str, float]:
    """Estimated seconds per rollout step of one case: rollout, score, update_actor,
    update_critic (as verl's timing_s keys group them)."""
    fields = dict(case["fields"])
    model, gpu = load_model(fields.pop("model")), get_gpu(fields.pop("gpu"))
    grid = make_grid({k: np.array([v]) for k, v in fields.items()})
    cols = ["step_time_s", "rl_rollout_s", "rl_score_s", "rl_critic_s", "rl_sync_s", "rl_offload_s"]
    timing = estimate_time(model, grid, columns=cols, **time_inputs(gpu))
    t = {k: float(v[0]) for k, v in timing.items()}
    steps = float(optimizer_steps_per_rollout(grid)[0])
    rl = t["rl_rollout_s"] + t["rl_score_s"] + t["rl_critic_s"] + t["rl_sync_s"] + t["rl_offload_s"]
    trainer = t["step_time_s"] - rl
    return {
        "gen": (t["rl_rollout_s"] + t["rl_sync_s"]) * steps,
        "score": t["rl_score_s"] * steps,
        "update_actor": trainer * steps + t["rl_offload_s"] * steps,
        "update_critic": t["rl_critic_s"] * steps,
        "step": t["step_time_s"] * steps,
    }


def rows() -> list[dict[str, Any]]:
    out = []
    for case in json.loads(DATA.read_text()):
        est = case_terms(case)
        m = case["measured_s"]
        measured = {
            "gen": m["gen"],
            "score": m.get("old_log_prob", 0.0) + m.get("ref", 0.0) + m.get("values", 0.0),
            "update_actor": m["update_actor"],
            "update_critic": m.get("update_critic", 0.0),
        }
        scale = case["response_max_tokens"] / case["fields"]["response_len"]
        at_max = est["gen"] * scale
        out.append({"id": case["id"], "est": est, "measured": measured, "gen_at_max": at_max})
    return out
