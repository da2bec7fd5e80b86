"""The estimator against traced PyTorch training steps (tests/data/groundtruth, see its README).

Persistent bytes (parameters, gradients, optimizer states) are exact in the traces and in the
model, so they are compared with `==`. Activations and the allocated peak are compared within
ACCEPTANCE_RTOL.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainmem.engine import estimate, make_grid, model_from_hf_config

GROUNDTRUTH_DIR = Path(__file__).parents[1] / "data" / "groundtruth"
CASE_PATHS = sorted(GROUNDTRUTH_DIR.glob("*.json"))

ACCEPTANCE_RTOL = 0.02
"""The issue's acceptance bound for activations and peak allocated bytes: within 2%."""


@functools.cache
def _case(stem: str) -> dict[str, Any]:
    return json.loads((GROUNDTRUTH_DIR / f"{stem}.json").read_text())


def _grid_columns(case: dict[str, Any]) -> dict[str, Any]:
    """The estimate flags that express a case (its README, "Multi-GPU cases").

    Same mapping as bench/_groundtruth.case_grid; written out here so that the golden test depends
    on the README and the engine only.
    """
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


@functools.cache
def _estimate(stem: str) -> dict[str, float]:
    case = _case(stem)
    model = model_from_hf_config(case["model_config"], name=case["id"])
    out = estimate(model, make_grid(_grid_columns(case)))
    assert out["reason"][0] == "", out["reason"][0]
    return {k: float(np.asarray(v)[0]) for k, v in out.items() if k != "reason"}


def _is_worst_rank_view(stem: str) -> bool:
    """pp_rank > 0 files trace a stage that is not the worst rank (README, pipeline cases)."""
    return _case(stem)["training"].get("pp_rank", 0) == 0


ALL = [p.stem for p in CASE_PATHS]
WORST_RANK = [s for s in ALL if _is_worst_rank_view(s)]
OTHER_STAGES = [s for s in ALL if not _is_worst_rank_view(s)]

PP_R0_CKPT = "llama-2-7b_pp4_r0_m8_1f1b_s4096_mb1_bf16_ckpt"
PP_R3_CKPT = "llama-2-7b_pp4_r3_m8_1f1b_s4096_mb1_bf16_ckpt"


def _known(stem: str, failing: str, reason: str) -> Any:
    """A case that currently fails a law; strict, so a fix turns it into a failure to clean up."""
    mark = pytest.mark.xfail(strict=True, reason=reason)
    return pytest.param(stem, marks=mark, id=stem) if stem == failing else pytest.param(stem, id=stem)


# The traces themselves show the last stage peaking higher than stage 0 here (17,770,128,384 B
# for rank 3 vs 17,770,087,424 B for rank 0), so the estimate's worst rank is the last stage and
# its states hold lm_head + final norm instead of the embedding (+8,192 B parameters and
# gradients, +16,384 B optimizer states). Stage 0's own states are modelled exactly.
_R0_STATES_REASON = "pp rank 0 is not the worst rank in this trace (rank 3 peaks higher)"


def _states_params(stems: list[str]) -> list[Any]:
    return [_known(s, PP_R0_CKPT, _R0_STATES_REASON) for s in stems]


@pytest.mark.parametrize("stem", ALL)
def test_num_parameters_matches_the_model_spec(stem: str) -> None:
    case = _case(stem)
    model = model_from_hf_config(case["model_config"], name=case["id"])
    assert model.num_parameters == case["num_parameters"]


@pytest.mark.parametrize("stem", _states_params(WORST_RANK))
def test_parameters_are_exact(stem: str) -> None:
    est, truth = _estimate(stem), _case(stem)
    expected = truth["bytes"]["parameters"]
    if truth["training"].get("zero") == 3:
        # FSDP2: the sharded fp32 parameters are the master weights (README, FSDP2 cases).
        assert est["parameters"] + est["master_weights"] == expected
    else:
        assert est["parameters"] == expected


@pytest.mark.parametrize("stem", _states_params(WORST_RANK))
def test_gradients_are_exact(stem: str) -> None:
    assert _estimate(stem)["gradients_total"] == _case(stem)["bytes"]["gradients"]


@pytest.mark.parametrize("stem", _states_params(WORST_RANK))
def test_optimizer_states_are_exact(stem: str) -> None:
    assert _estimate(stem)["optimizer_states"] == _case(stem)["bytes"]["optimizer_states"]


@pytest.mark.parametrize("stem", WORST_RANK)
def test_activations_within_acceptance(stem: str) -> None:
    est = _estimate(stem)["activations_total"]
    assert est == pytest.approx(_case(stem)["bytes"]["activations"], rel=ACCEPTANCE_RTOL)


@pytest.mark.parametrize("stem", WORST_RANK)
def test_peak_allocated_within_acceptance(stem: str) -> None:
    est = _estimate(stem)["peak_allocated_bytes"]
    assert est == pytest.approx(_case(stem)["bytes"]["peak_allocated"], rel=ACCEPTANCE_RTOL)


# The estimate is the worst rank's; a stage that is not the worst is bounded by it, so only that
# bound is asserted. Known failure: both stages' optimizer-step peaks miss 7 micro-batches of
# int64 input_ids/labels (7 x 4096 x 8 = 229,376 B; the schedule holds the whole global batch),
# so the worst-rank estimate 17,769,899,008 B is below rank 3's traced 17,770,128,384 B.
@pytest.mark.parametrize(
    "stem",
    [
        _known(s, PP_R3_CKPT, "optimizer-step peak omits the other micro-batches' input ids")
        for s in OTHER_STAGES
    ],
)
def test_worst_rank_bounds_every_stage(stem: str) -> None:
    assert _estimate(stem)["peak_allocated_bytes"] >= _case(stem)["bytes"]["peak_allocated"]


def test_every_case_is_checked() -> None:
    assert len(ALL) > 0
    assert sorted(WORST_RANK + OTHER_STAGES) == ALL
