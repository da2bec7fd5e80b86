"""estimate_one() (engine/_fast/_scalar.py) returns, for each configuration, what estimate() returns
in that configuration's row: every column, to the bit, on the engine recording's rows (every
family, a traced profile, valid and invalid layouts) and on rows drawn from the declarations
(tests/strategies.py: every field, every preset), for the worst rank, a given pipeline stage
and a column subset, cold (terms evaluated) and warm (terms cached)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.strategies import columns_of, models, rows
from trainmem.catalog import load_model, load_profile
from trainmem.engine import OUTPUT_DTYPES, OUTPUTS, Overheads, estimate, make_grid
from trainmem.engine._fast._scalar import _caches, encode_row, estimate_one

RECORDING = Path(__file__).parent / "data" / "engine_recording.npz"
PROFILE = Path(__file__).parents[2] / "data" / "profiles" / "vit-base.json"


def _cases() -> list[tuple[str, dict[str, np.ndarray], dict[str, np.ndarray]]]:
    with np.load(RECORDING) as data:
        keys = list(data.keys())
        ids = sorted({k.split(".", 1)[0] for k in keys})

        def part(i: str, kind: str) -> dict[str, np.ndarray]:
            prefix = f"{i}.{kind}."
            return {k[len(prefix) :]: data[k] for k in keys if k.startswith(prefix)}

        return [(str(data[f"{i}.model"]), part(i, "in"), part(i, "opt")) for i in ids]


CASES = _cases()


def _rows(cols: dict[str, np.ndarray]) -> list[dict]:
    n = len(cols["tp"])
    return [{k: v[i].item() for k, v in cols.items()} for i in range(n)]


def _same(got: dict, want: dict, i: int, label: str) -> None:
    assert list(got) == list(want), label
    for k, column in want.items():
        expected = column[i].item()
        assert type(got[k]) is type(expected) or isinstance(expected, float), (label, k)
        same = got[k] == expected or (expected != expected and got[k] != got[k])
        assert same, f"{label} row {i} {k}: {got[k]!r} != {expected!r}"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_estimate_one_equals_estimate(case) -> None:
    name, cols, options = case
    m = load_profile(PROFILE) if name == "profile" else load_model(name)
    g = make_grid(cols)
    usable = float(options["usable_bytes"])
    ov = Overheads(fragmentation_fraction=0.2, cublas_workspace_bytes=2**25)
    worst = estimate(m, g, usable_bytes=usable, overheads=ov)
    stage = estimate(m, g, pp_stage=options["pp_stage"])
    subset = ("peak_device_bytes", "fits", "host_bytes", "pp_stage")
    few = estimate(m, g, columns=subset)
    for attempt in ("cold", "warm"):
        if attempt == "cold":
            _caches.clear()
        for i, row in enumerate(_rows(cols)):
            label = f"{name} {attempt}"
            _same(estimate_one(m, row, usable_bytes=usable, overheads=ov), worst, i, label)
            got = estimate_one(m, row, pp_stage=int(options["pp_stage"][i]))
            _same(got, stage, i, label + " stage")
            _same(estimate_one(m, row, columns=subset), few, i, label + " subset")
    assert set(worst) == set(OUTPUTS)
    for k, column in worst.items():  # the dtypes the report's one-row columns are given
        assert column.dtype == OUTPUT_DTYPES.get(k, np.float64), k


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_estimate_one_equals_a_drawn_row_of_estimate(data: st.DataObject) -> None:
    """Rows of every field drawn (a quarter with each field on its own, often invalid), cold
    and warm, at the worst rank, a drawn stage and a drawn column subset."""
    m = data.draw(models())
    drawn = data.draw(st.lists(rows(m, valid_only=False), min_size=1, max_size=4))
    stages = [data.draw(st.integers(0, max(r["pp"], 1) - 1)) for r in drawn]
    subset = data.draw(st.sets(st.sampled_from(OUTPUTS), min_size=1).map(sorted))
    g = make_grid(columns_of(drawn))
    worst = estimate(m, g, usable_bytes=80e9)
    stage = estimate(m, g, pp_stage=np.array(stages))
    few = estimate(m, g, columns=subset)
    for attempt in ("cold", "warm"):
        if attempt == "cold":
            _caches.clear()
        for i, row in enumerate(drawn):
            _same(estimate_one(m, row, usable_bytes=80e9), worst, i, f"{m.name} {attempt}")
            got = estimate_one(m, row, pp_stage=stages[i])
            _same(got, stage, i, f"{m.name} {attempt} stage")
            _same(estimate_one(m, row, columns=subset), few, i, f"{m.name} {attempt} subset")


def test_encode_row_checks_like_make_grid() -> None:
    row = encode_row({"precision": "amp-bf16", "micro_batch_size": 4.0, "lora_targets": "q_proj"})
    g = make_grid(precision="amp-bf16", micro_batch_size=4, lora_targets="q_proj")
    assert row == {k: v[0].item() for k, v in g.items()}
    with pytest.raises(ValueError, match="precision: unknown value 'fp64'; allowed: fp32"):
        encode_row({"precision": "fp64"})
    with pytest.raises(ValueError, match="unknown grid field"):
        encode_row({"batch": 4})
    with pytest.raises(ValueError, match="micro_batch_size: must be whole numbers"):
        encode_row({"micro_batch_size": 2.5})
