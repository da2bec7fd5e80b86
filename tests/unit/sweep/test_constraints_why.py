"""Trustworthy winners (issue 16, item 2): `--min-gpus`, `--use-all-gpus` and `--max-step-time`
constraints, rows that differ only in an ineffective ZeRO stage shown once, the table and
`--json` agreeing row for row, and the "why this one" block that sets the best point's step
against the best conventional layout's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from trainmem.catalog import load_model
from trainmem.cli import main
from trainmem.hardware import ENV_VAR, GIB, load_gpus, parse_fleet
from trainmem.sweep import run_sweep
from trainmem.sweep._exhaustive import space_fingerprint
from trainmem.sweep._points import SAME_BUT_ZERO, _best_of
from trainmem.sweep._space import (
    ALL_REASONS,
    PART_OF_POOL,
    SLOWER_THAN_MAX,
    evaluate_columns,
    make_space,
    node_host_bytes,
    ranks_per_node,
)
from trainmem.sweep._why import CONVENTIONAL, LAYOUT_FIELDS, STEP_PARTS, is_conventional

GPUS = load_gpus()
QUESTION = ["--model", "llama-3.1-70b", "--fleet", "64xh100-sxm-80gb", "--seq-len", "4096"]
"""Issue 16's question: Llama-3-70B on 64 x H100 at 4k tokens, global batch 256."""


@pytest.fixture(autouse=True)
def _no_user_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _space(fleet: str = "64xh100-sxm-80gb", model: str = "llama-3.1-70b", **kw: Any):
    return make_space(
        load_model(model), parse_fleet(fleet, GPUS), GPUS, seq_len=4096, global_batch_size=256, **kw
    )


# ---- constraints --------------------------------------------------------------------------------


def test_min_gpus_starts_the_gpu_count_axis() -> None:
    assert _space().axes["num_gpus"] == (1, 2, 4, 8, 16, 32, 64)
    assert _space(min_gpus=32).axes["num_gpus"] == (32, 64)
    assert _space(min_gpus=20).axes["num_gpus"] == (32, 64)


def test_use_all_gpus_keeps_whole_pools_only() -> None:
    space = _space(fleet="16xh100-sxm-80gb,8xa100-sxm-80gb", use_all_gpus=True)
    assert space.axes["num_gpus"] == (8, 16)
    res = space.evaluate(range(space.num_points))
    size = np.array([p.num_gpus for p in space.fleet.pools])[res["pool"]]
    whole = res["num_gpus"] == size
    assert not res["fits"][~whole].any() and res["fits"][whole].any()
    # a smaller pool's size on the larger pool is the constraint's reason (when valid otherwise)
    assert (res["reason"][~whole & (res["num_gpus"] <= size)] == PART_OF_POOL).any()
    assert ALL_REASONS[PART_OF_POOL] == "num_gpus is not the whole pool (--use-all-gpus)"


def test_max_step_time_marks_slower_points_and_keeps_their_time() -> None:
    free, capped = _space(), _space(max_step_time_s=20.0)
    a, b = free.evaluate(range(free.num_points)), capped.evaluate(range(capped.num_points))
    slow = a["fits"] & (a["step_time_s"] > 20.0)
    assert slow.any() and (a["fits"] & ~slow).any()
    np.testing.assert_array_equal(b["fits"], a["fits"] & ~slow)
    assert (b["reason"][slow] == SLOWER_THAN_MAX).all()
    np.testing.assert_array_equal(b["step_time_s"][slow], a["step_time_s"][slow])


def test_the_constrained_optimum_is_the_optimum_of_the_qualifying_points() -> None:
    free = run_sweep(model="llama-3.1-70b", fleet="64xh100-sxm-80gb", out=None)
    capped = run_sweep(
        model="llama-3.1-70b", fleet="64xh100-sxm-80gb", out=None, max_step_time_s=15.1,
        min_gpus=64,
    )  # fmt: skip
    best = capped.result.best[0]
    assert best["step_time_s"] <= 15.1 and best["num_gpus"] == 64
    top = free.result.top.filter((pl.col("step_time_s") <= 15.1) & (pl.col("num_gpus") >= 64))
    assert best["cost_per_million_tokens"] == top["cost_per_million_tokens"][0]


def test_constraints_change_the_part_names_only_when_set() -> None:
    base = space_fingerprint(_space(), chunk_size=100_000)
    assert space_fingerprint(_space(use_all_gpus=False), chunk_size=100_000) == base
    assert space_fingerprint(_space(use_all_gpus=True), chunk_size=100_000) != base
    assert space_fingerprint(_space(max_step_time_s=30.0), chunk_size=100_000) != base


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--min-gpus", "100"], "error: min-gpus: must be 1-64 (the largest pool), got 100"),
        (["--min-gpus", "0"], "error: min_gpus: must be in [1, 16777216], got 0"),
        (["--max-step-time", "0"], "error: max_step_time_s (--max-step-time): must be > 0"),
        (["--num-gpus", "8", "--min-gpus", "16"], "error: num-gpus: 8 is below --min-gpus 16"),
        (
            ["--num-gpus", "8", "--use-all-gpus"],
            "error: num-gpus: 8 with --use-all-gpus must be a pool's size: 64",
        ),
    ],
)
def test_bad_constraints_are_one_line_errors(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["sweep", *QUESTION, "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not out.exists()


def test_recommend_takes_the_same_constraints(capsys: pytest.CaptureFixture[str]) -> None:
    report = _json(capsys, ["recommend", *QUESTION, "--use-all-gpus", "--json"])
    assert report["num_gpus"] == 64
    assert all(a["num_gpus"] == 64 for a in report["alternatives"])
    slow = _json(capsys, ["recommend", *QUESTION, "--max-step-time", "1", "--json"])
    assert slow["fits"] is False


# ---- ties ----------------------------------------------------------------------------------------


def test_rows_equal_but_for_the_zero_stage_are_shown_once() -> None:
    rows = {
        **{k: [0.0] * 4 for k in SAME_BUT_ZERO},
        "zero": [1, 2, 3, 0],
        "cost_per_million_tokens": [1.0, 1.0, 1.0, 2.0],
        "gpu": ["h100"] * 4,
    }
    top = _best_of(pl.DataFrame(rows), keys=["cost_per_million_tokens"], top=10, distinct=())
    assert top["zero"].to_list() == [1, 0]


def test_no_table_repeats_a_point_under_another_zero_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One GPU per data-parallel rank (tp 8 on 8 GPUs): ZeRO 0-3 give the same point.
    argv = ["sweep", "--model", "llama-3.1-8b", "--fleet", "8xh100-sxm-80gb", "--tp", "8"]
    argv += ["--cp", "1", "--out", str(tmp_path / "o"), "--json"]
    payload = _json(capsys, argv)
    keys = [tuple(r["configuration"][k] for k in ("num_gpus", "pp", "virtual_stages",
            "recompute", "offload", "micro_batch_size")) + (r["peak_device_bytes"],)
            for r in payload["top"]]  # fmt: skip
    assert len(keys) == len(set(keys)) == 10
    stored = pl.read_parquet(tmp_path / "o" / "points" / "**" / "*.parquet").filter("fits")
    dupes = stored.filter(pl.col("dp") == 1).group_by(list(SAME_BUT_ZERO)).len()
    assert dupes["len"].max() > 1  # the points are stored; only the table shows each once


# ---- table = JSON, and the why block -------------------------------------------------------------


def test_the_table_and_the_json_list_the_same_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sweep", *QUESTION, "--out", str(tmp_path / "o")]
    payload = _json(capsys, [*argv, "--json"])
    assert main(argv) == 0
    text = capsys.readouterr().out.splitlines()
    first = next(i for i, line in enumerate(text) if line.startswith("gpu "))
    table = [line.split() for line in text[first + 1 : first + 1 + len(payload["top"])]]
    fields = ("gpu", "num_gpus", "tp", "pp", "virtual_stages", "cp", "ep", "zero", "recompute")
    for cells, row in zip(table, payload["top"], strict=True):
        assert cells[: len(fields)] == [str(row["configuration"][k]) for k in fields]
        assert float(cells[-3]) == pytest.approx(row["peak_device_bytes"] / GIB, abs=0.006)
    assert payload["top"][0] == payload["best"]


def test_the_70b_question_explains_its_winner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    payload = _json(capsys, ["sweep", *QUESTION, "--out", str(tmp_path), "--json"])
    best = payload["best"]["configuration"]
    why_block = payload["why"]
    conv = why_block["conventional"]
    # The winner's ranks fit the node's host RAM (DGX H100: 2 TiB), offloading or not.
    space = _space()
    named = ("recompute", "offload", "ref_model", "rl_trainer_offload")
    cols = {k: np.array([best[k]], dtype=object if k in named else np.int64)
            for k in LAYOUT_FIELDS}  # fmt: skip
    res = evaluate_columns(space, {"pool": np.array([0]), **cols}, columns=("host_bytes",))
    need = node_host_bytes(res["host_bytes"], ranks_per_node(res["num_gpus"], np.array([8])))
    assert res["fits"][0] and need[0] <= 2048 * GIB
    # The conventional layout: tp over the node, cp 1, no offload, on the same 64 GPUs.
    c = conv["configuration"]
    assert (c["tp"], c["cp"], c["offload"], c["num_gpus"]) == (8, 1, "none", 64)
    assert why_block["conventional_rule"] == f"{CONVENTIONAL}, same GPUs"
    assert conv["cost_per_million_tokens"] >= payload["best"]["cost_per_million_tokens"]
    for side in (why_block["best"], conv):  # the parts add up to the step
        parts = side["step_parts_s"]
        assert set(parts) == {k for k, _ in STEP_PARTS}
        assert sum(parts.values()) == pytest.approx(side["step_time_s"], rel=1e-9)
    assert why_block["best"]["step_time_s"] == pytest.approx(payload["best"]["step_time_s"])
    biggest = why_block["differences"][0]
    assert biggest["saved_s"] == pytest.approx(biggest["conventional_s"] - biggest["best_s"])
    assert abs(biggest["saved_s"]) == max(abs(d["saved_s"]) for d in why_block["differences"])
    assert why_block["summary"].startswith(f"{_pct(conv, payload['best'])}% cheaper per token")
    assert why_block["layout_changes"]["tp"] == [8, best["tp"]]


def _pct(conv: dict[str, Any], best: dict[str, Any]) -> str:
    return f"{(conv['cost_per_million_tokens'] / best['cost_per_million_tokens'] - 1) * 100:.1f}"


def test_a_conventional_winner_says_so() -> None:
    run = run_sweep(model="llama-3.1-70b", fleet="64xh100-sxm-80gb", out=None, tp=8, cp=1,
                    offload="none", num_gpus=64)  # fmt: skip
    assert run.why is not None and is_conventional(run.space, run.result.best[0])
    assert run.why["conventional"] is None and run.why["best_is_conventional"]
    assert run.why["summary"].startswith("The best point is the best conventional layout")


def test_no_conventional_layout_when_offload_is_pinned() -> None:
    run = run_sweep(model="llama-3.1-8b", fleet="8xh100-sxm-80gb", out=None, offload="optimizer")
    assert run.why is not None and run.why["conventional"] is None
    assert run.why["summary"].startswith("No conventional layout")


def test_the_table_prints_the_why_block(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", *QUESTION, "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "why this one: " in out and "exposed tensor-parallel communication" in out


def test_a_constrained_sweep_is_its_own_study(tmp_path: Path) -> None:
    # An Optuna study rebuilt from its stored points must not mix points judged under other
    # constraints: the default study name carries them (unset: the name it always had).
    free = run_sweep(model="llama-3.2-1b", out=str(tmp_path), method="optuna", trials=12)
    capped = run_sweep(
        model="llama-3.2-1b", out=str(tmp_path), method="optuna", trials=12,
        max_step_time_s=5.0, min_gpus=2, use_all_gpus=True,
    )  # fmt: skip
    assert free.study == "llama-3.2-1b-8xh100-sxm-80gb-s4096-g256-optuna"
    assert capped.study == f"{free.study}-min2-all-max5s"
    assert capped.result.best and capped.result.best[0]["step_time_s"] <= 5.0
    assert capped.result.best[0]["num_gpus"] == 8
