"""Error bars from the evidence (issue 28, item 3): the shipped interval parameters are the fit
of today's evidence, the 90% intervals cover at least 85% of the published cases held out of
their fit, the README shows what the evidence gives, and every answer carries the keys."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from tests import error_bars as eb
from tests.accuracy_table import README
from trainmem.engine import FRAMEWORKS
from trainmem.report._error_bars import (
    ERROR_BAR_KEYS,
    ERROR_BARS_FILE,
    REGIMES,
    Z90,
    error_bar_columns,
    error_bar_report,
    normal_cdf,
    regime_of,
    shrunk_normal,
)

REGENERATE = "stale: regenerate with `python -m bench.error_bars --write`"


def test_shipped_parameters_are_the_fit_of_the_evidence() -> None:
    shipped = json.loads(ERROR_BARS_FILE.read_text())
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", shipped["fitted_on"])
    assert eb.comparable(shipped) == eb.comparable(eb.shipped_document(fitted_on="")), REGENERATE


@pytest.mark.parametrize("by", ["case", "source"])
def test_held_out_coverage_of_the_90_percent_intervals(by: str) -> None:
    """The issue's done-when: cover >= 85% of the published cases not fitted on (leave one case
    out; and leave every case of a source page out, the stricter split)."""
    held = eb.held_out(by)
    assert held["num_cases"] >= 50
    assert held["coverage"] >= 0.85, held["misses"]


def test_readme_block_is_generated() -> None:
    text = README.read_text()
    block = text.split(eb.README_BEGIN)[1].split(eb.README_END)[0].strip()
    assert block == eb.widths_markdown(), "run `python -m bench.error_bars --update-readme`"


def test_every_stack_and_regime_has_parameters() -> None:
    groups = json.loads(ERROR_BARS_FILE.read_text())["groups"]
    floor = json.loads(ERROR_BARS_FILE.read_text())["sigma_floor_log"]
    assert set(groups) == {f"{f}/{r}" for f in FRAMEWORKS for r in REGIMES}
    assert all(g["sigma_log"] >= floor > 0 for g in groups.values())


def test_shrinkage_pulls_a_small_group_to_its_parent() -> None:
    """Two cases far from the parent: the mean moves 2/7 of the way, the variance widens."""
    mean, var = shrunk_normal(np.array([0.5, 0.5]), parent_mean=0.0, parent_var=0.01)
    assert mean == pytest.approx(2 * 0.5 / 7)
    assert var > 0.01
    assert shrunk_normal(np.array([]), parent_mean=0.1, parent_var=0.02) == (0.1, 0.02)


def test_normal_cdf_against_erf() -> None:
    z = np.linspace(-6, 6, 241)
    exact = np.array([0.5 * (1 + math.erf(v / math.sqrt(2))) for v in z])
    assert np.max(np.abs(normal_cdf(z) - exact)) < 2e-7
    assert normal_cdf(np.array([Z90]))[0] == pytest.approx(0.95, abs=1e-6)


def test_columns_laws() -> None:
    """The interval brackets exp(mean) x peak and holds 90%; fit_probability is in [0, 1],
    rises with the limit and falls with the peak; 0 for no memory, NaN for no peak."""
    n = 200
    rng = np.random.default_rng(0)
    peak = rng.uniform(1e9, 9e10, n)
    limit = rng.uniform(1e9, 9e10, n)
    fw = rng.integers(0, len(FRAMEWORKS), n)
    rg = rng.integers(0, len(REGIMES), n)
    cols = error_bar_columns(peak, limit, framework=fw, regime=rg)
    assert np.all(cols["peak_device_bytes_low"] < cols["peak_device_bytes_high"])
    p = cols["fit_probability"]
    assert np.all((p >= 0) & (p <= 1))
    more = error_bar_columns(peak, limit * 1.1, framework=fw, regime=rg)["fit_probability"]
    bigger = error_bar_columns(peak * 1.1, limit, framework=fw, regime=rg)["fit_probability"]
    assert np.all(more >= p) and np.all(bigger <= p)
    # At the interval's ends the probability is 5% and 95%.
    at_high = error_bar_columns(peak, cols["peak_device_bytes_high"], framework=fw, regime=rg)
    at_low = error_bar_columns(peak, cols["peak_device_bytes_low"], framework=fw, regime=rg)
    assert np.allclose(at_high["fit_probability"], 0.95, atol=1e-6)
    assert np.allclose(at_low["fit_probability"], 0.05, atol=1e-6)
    edge = error_bar_columns(
        np.array([1e9, np.nan]), np.array([0.0, 1e9]), framework=[0, 0], regime=[0, 0]
    )
    assert edge["fit_probability"][0] == 0.0 and np.isnan(edge["fit_probability"][1])


def test_regimes() -> None:
    got = regime_of(lora_rank=np.array([0, 8, 8, 0]), qlora=np.array([False, False, True, True]))
    assert [REGIMES[k] for k in got] == ["full", "lora", "qlora", "full"]


def test_one_answer_equals_its_row_of_the_columns() -> None:
    config = {"framework": "torchtune", "lora_rank": 16, "qlora": False}
    one = error_bar_report(5e10, 7e10, config)
    cols = error_bar_columns(
        np.array([1e10, 5e10]),
        np.array([7e10, 7e10]),
        framework=[FRAMEWORKS.index("torchtune")] * 2,
        regime=[1, 1],
    )
    assert one["peak_device_bytes_low"] == round(cols["peak_device_bytes_low"][1])
    assert one["peak_device_bytes_high"] == round(cols["peak_device_bytes_high"][1])
    assert one["fit_probability"] == pytest.approx(cols["fit_probability"][1], abs=2e-7)
    for peak, limit in ((5e10, 0.0), (0.0, 7e10)):
        got = error_bar_report(peak, limit, config)["fit_probability"]
        col = error_bar_columns([peak], [limit], framework=[4], regime=[1])["fit_probability"]
        assert got == col[0]
    assert one["error_bars"]["regime"] == "lora" and one["error_bars"]["num_cases"] == 1


def test_estimate_and_fit_answers_carry_the_keys() -> None:
    from trainmem import estimate, fit

    report = estimate(model="gpt2", framework="torchtitan", seq_len=1024, headroom=0.1)
    assert report["peak_device_bytes_low"] < report["peak_device_bytes"]
    assert report["peak_device_bytes"] < report["peak_device_bytes_high"]
    assert report["fit_probability"] > 0.999  # gpt2 on an 80 GB GPU
    assert report["error_bars"]["stack"] == "torchtitan"
    answer = fit(model="gpt2", seq_len=1024, max_micro_batch_size=64)
    assert all(answer[k] == answer["estimate"][k] for k in ERROR_BAR_KEYS)


def test_human_output_has_the_interval_line() -> None:
    from trainmem import estimate
    from trainmem.report import human_table

    text = human_table(estimate(model="gpt2", seq_len=1024))
    assert re.search(r"90% interval of the device peak: [\d.]+-[\d.]+ GiB .*P\(fits", text)


def test_http_answers_carry_the_keys() -> None:
    pytest.importorskip("fastapi", reason="trainmem[serve] not installed")
    from fastapi.testclient import TestClient

    from trainmem.serve._app import create_app

    job = {"model": "gpt2", "seq_len": 1024}
    search = {**job, "global_batch_size": 32, "max_pp": 1, "max_cp": 1, "max_micro_batch_size": 4}
    with TestClient(create_app()) as http:
        for path, body in (("/v1/estimate", job), ("/v1/fit", job), ("/v1/recommend", search)):
            got = http.post(path, json=body)
            assert got.status_code == 200, got.text
            answer = got.json()
            assert set(ERROR_BAR_KEYS) <= set(answer), path
            assert 0.0 <= answer["fit_probability"] <= 1.0
            assert answer["peak_device_bytes_low"] < answer["peak_device_bytes_high"]


def test_sweep_points_carry_the_columns() -> None:
    """Every evaluated point: the error bars of its stack and regime against its own GPU's
    usable memory less the headroom, as one answer computes them."""
    from trainmem.catalog import load_model
    from trainmem.hardware import load_gpus, parse_fleet
    from trainmem.sweep._space import make_space

    gpus = load_gpus()
    fleet = parse_fleet("8xh100-sxm-80gb,4xa100-sxm-40gb", gpus)
    space = make_space(
        load_model("llama-3.2-1b"),
        fleet,
        gpus,
        seq_len=1024,
        global_batch_size=32,
        framework="litgpt",
        training={"lora_rank": 8},
    )
    res = space.evaluate(np.arange(min(space.num_points, 400)))
    for j in (0, len(res["fits"]) - 1):
        profile = gpus[fleet.pools[int(res["pool"][j])].gpu]
        one = error_bar_report(
            res["peak_device_bytes"][j],
            profile.usable_bytes * (1 - space.headroom),
            {"framework": "litgpt", "lora_rank": 8},
        )
        assert one["peak_device_bytes_low"] == round(res["peak_device_bytes_low"][j])
        assert one["fit_probability"] == pytest.approx(res["fit_probability"][j], abs=2e-7)
        assert one["error_bars"]["regime"] == "lora"


def test_heatmap_cells_carry_the_columns() -> None:
    """Each cell: its error bars as one answer gives them; NaN where the layout is invalid."""
    from trainmem.catalog import load_model
    from trainmem.engine import TrainingConfig
    from trainmem.hardware import get_gpu
    from trainmem.sweep._heatmap import heatmap_cells

    profile = get_gpu("h100-sxm-80gb")
    config = TrainingConfig.from_fields({"framework": "torchtune"}).grid_columns()
    config = {k: v for k, v in config.items() if k not in ("micro_batch_size", "seq_len")}
    cells = heatmap_cells(
        load_model("llama-3.2-1b"),
        profile,
        config,
        x="micro_batch_size",
        x_values=[1, 8],
        y="seq_len",
        y_values=[1024, 4096],
        headroom=0.1,
    )
    for row in cells.to_dicts():
        one = error_bar_report(row["peak_device_bytes"], profile.usable_bytes * 0.9, config)
        assert one["peak_device_bytes_high"] == row["peak_device_bytes_high"]
        assert one["fit_probability"] == pytest.approx(row["fit_probability"], abs=2e-7)
