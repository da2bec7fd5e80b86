"""A search's answer says how much of the fleet it uses and the time to train a token budget
(`--tokens`), and a cost budget makes `--objective time` the fastest plan under it (issue 27
item 1: `sweep --fleet 128xa100` answered with 32 of the 128 GPUs without saying so)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainmem.catalog import load_model
from trainmem.cli import main
from trainmem.hardware import load_gpus, parse_fleet
from trainmem.sweep._exhaustive import space_fingerprint
from trainmem.sweep._fleet_use import duration_text, fleet_use, fleet_use_text
from trainmem.sweep._space import ALL_REASONS, COSTLIER_THAN_MAX, make_space

GPUS = load_gpus()
FLEET = ["--fleet", "128xa100-sxm-80gb"]
TOKENS = 1e10


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _text(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_fleet_use_is_the_budget_over_the_throughput() -> None:
    fleet = parse_fleet("128xa100-sxm-80gb", GPUS)
    use = fleet_use(
        fleet, used_gpus=32, tokens=3.6e9, tokens_per_second=1e5, cost_per_million_tokens=0.5
    )
    assert use == {
        "fleet_gpus": 128,
        "used_gpus": 32,
        "tokens": 3.6e9,
        "time_to_train_s": 36000.0,
        "cost_to_train_usd": 1800.0,
    }
    assert fleet_use_text(use) == "uses 32 of 128 GPUs; 3.6e+09 tokens in 10 hours ($1,800)"
    none = fleet_use(
        fleet, used_gpus=None, tokens=1e9, tokens_per_second=None, cost_per_million_tokens=None
    )
    assert none["time_to_train_s"] is None and fleet_use_text(none) == "uses none of 128 GPUs"
    assert duration_text(3 * 86400) == "3 days"


def test_sweep_says_how_many_gpus_and_the_time_to_train(tmp_path: Path, capsys) -> None:
    argv = ["sweep", *FLEET, "--tokens", str(TOKENS), "--out", str(tmp_path)]
    out = _json(capsys, [*argv, "--json"])
    best = out["best"]
    assert out["fleet_gpus"] == 128 and out["used_gpus"] == best["configuration"]["num_gpus"]
    assert out["tokens"] == TOKENS
    assert out["time_to_train_s"] == pytest.approx(TOKENS / best["tokens_per_second"])
    assert out["cost_to_train_usd"] == pytest.approx(TOKENS / 1e6 * best["cost_per_million_tokens"])
    lines = _text(capsys, argv).splitlines()
    assert lines[1].startswith(f"best uses {out['used_gpus']} of 128 GPUs; 1e+10 tokens in ")
    # without --tokens: the GPUs, no time
    plain = _json(capsys, ["sweep", *FLEET, "--out", str(tmp_path / "b"), "--json"])
    assert plain["fleet_gpus"] == 128 and plain["time_to_train_s"] is None


def test_recommend_header_and_json_say_the_fleet_use(capsys) -> None:
    argv = ["recommend", *FLEET, "--tokens", str(TOKENS)]
    out = _json(capsys, [*argv, "--json"])
    assert out["fleet_gpus"] == 128 and out["used_gpus"] == out["num_gpus"]
    assert out["time_to_train_s"] == pytest.approx(TOKENS / out["tokens_per_second"])
    first = _text(capsys, argv).splitlines()[0]
    assert f"; the best uses {out['num_gpus']} of 128 GPUs; 1e+10 tokens in " in first


def test_the_fastest_plan_under_a_cost_budget(tmp_path: Path, capsys) -> None:
    cheapest = _json(capsys, ["recommend", *FLEET, "--json"])
    fastest = _json(capsys, ["recommend", *FLEET, "--objective", "time", "--json"])
    budget = (cheapest["cost_per_million_tokens"] + fastest["cost_per_million_tokens"]) / 2
    assert cheapest["cost_per_million_tokens"] < budget < fastest["cost_per_million_tokens"]
    argv = ["recommend", *FLEET, "--objective", "time", "--max-cost-per-million-tokens"]
    under = _json(capsys, [*argv, str(budget), "--json"])
    assert under["fits"] and under["cost_per_million_tokens"] <= budget
    assert fastest["step_time_s"] <= under["step_time_s"] <= cheapest["step_time_s"]
    for alternative in under["alternatives"]:
        assert alternative["cost_per_million_tokens"] <= budget
    # the same budget on a sweep
    argv = ["sweep", *FLEET, "--objective", "time", "--max-cost-per-million-tokens", str(budget)]
    swept = _json(capsys, [*argv, "--out", str(tmp_path), "--json"])
    assert swept["best"]["cost_per_million_tokens"] <= budget


def test_a_dearer_point_is_invalid_with_its_reason_and_cost_kept() -> None:
    space = make_space(
        load_model("llama-3.1-8b"),
        parse_fleet("64xh100-sxm-80gb", GPUS),
        GPUS,
        seq_len=4096,
        global_batch_size=256,
        max_cost_per_million_tokens=0.2,
    )
    free = make_space(
        load_model("llama-3.1-8b"),
        parse_fleet("64xh100-sxm-80gb", GPUS),
        GPUS,
        seq_len=4096,
        global_batch_size=256,
    )
    rows = np.arange(0, space.num_points, max(space.num_points // 4000, 1))
    capped, open_ = space.evaluate(rows), free.evaluate(rows)
    dear = (open_["reason"] == 0) & (open_["cost_per_million_tokens"] > 0.2)
    assert dear.any() and (capped["reason"][dear] == COSTLIER_THAN_MAX).all()
    assert not capped["fits"][dear].any()
    np.testing.assert_array_equal(
        capped["cost_per_million_tokens"][dear], open_["cost_per_million_tokens"][dear]
    )
    assert ALL_REASONS[COSTLIER_THAN_MAX] == "cost above --max-cost-per-million-tokens"
    assert space_fingerprint(space, chunk_size=1) != space_fingerprint(free, chunk_size=1)


def test_nothing_under_a_budget_says_which_flag_to_loosen(tmp_path: Path, capsys) -> None:
    argv = ["sweep", *FLEET, "--max-cost-per-million-tokens", "0.001", "--out", str(tmp_path)]
    text = _text(capsys, argv)
    assert "nothing fits" in text and "loosen --max-cost-per-million-tokens" in text


def test_a_sweep_that_fits_nowhere_names_the_closest_point_and_what_to_change(
    tmp_path: Path, capsys
) -> None:
    """The stumble: the human output raised KeyError 'headroom_bytes' (the points hold none)."""
    argv = ["sweep", "--model", "llama-3.1-70b", "--fleet", "8xa100-sxm-40gb"]
    lines = _text(capsys, [*argv, "--out", str(tmp_path)]).splitlines()
    assert lines[1].startswith("nothing fits; closest: 8 x a100-sxm-40gb, ")
    assert "peak 185.94 GiB, 150.48 GiB over the limit" in lines[1]  # recommend's margin
    assert "`trainmem estimate` of it lists the changes that make it fit" in lines[1]
    out = _text(capsys, ["recommend", "--model", "llama-3.1-70b", "--fleet", "8xa100-sxm-40gb"])
    assert "margin -150.48 GiB" in out
    assert out.splitlines()[-1].startswith("  what to change: run the reproduce line")
