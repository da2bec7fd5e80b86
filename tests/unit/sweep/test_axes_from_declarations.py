"""The search axes come from the training fields' declarations (`sweep_axis=True`), not from
hand-kept lists: a field flipped to a search axis is searched everywhere, with no other edit,
and each former hand list equals its derived value."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from trainmem.engine import KNOBS, OFFLOADS, RECOMPUTE
from trainmem.engine._vocab import REF_MODELS, RL_TRAINER_OFFLOADS
from trainmem.sweep import _axes, _heatmap, _optuna, _parts, _space, _study
from trainmem.sweep._space import make_space

# ---- each former hand list equals its derived value (regression) ------------------------------

RL = ("rollout_tp", "ref_model", "rl_trainer_offload")
"""The RL axes (declared rl_axis): searched only for an --rl job, after the former ones."""

FORMER_AXES = (
    "pool",
    "num_gpus",
    "tp",
    "pp",
    "virtual_stages",
    "cp",
    "ep",
    "zero",
    "recompute",
    "offload",
    "micro_batch_size",
    *RL,
)
FORMER_LAYOUT_AXES = ("pool", "num_gpus", "tp", "pp", "virtual_stages", "cp", "ep")
FORMER_INNER_AXES = ("zero", "recompute", "offload", "micro_batch_size", *RL)
FORMER_SHOW = (
    "gpu",
    "num_gpus",
    "tp",
    "pp",
    "virtual_stages",
    "cp",
    "ep",
    "dp",
    "zero",
    "recompute",
    "offload",
    "micro_batch_size",
    *RL,
    "grad_accum_steps",
)
FORMER_SWEEP_HEADS = (
    "gpu",
    "n",
    "tp",
    "pp",
    "v",
    "cp",
    "ep",
    "zero",
    "recompute",
    "offload",
    "mbs",
    "rtp",
    "ref",
    "rl_offload",
    "accum",
)
FORMER_ROW = (
    "gpu",
    "num_gpus",
    "num_nodes",
    "tp",
    "pp",
    "virtual_stages",
    "cp",
    "ep",
    "dp",
    "zero",
    "recompute",
    "offload",
    "micro_batch_size",
    *RL,
    "grad_accum_steps",
)
FORMER_HEADS = (
    "gpu",
    "n",
    "nodes",
    "tp",
    "pp",
    "v",
    "cp",
    "ep",
    "dp",
    "zero",
    "recompute",
    "offload",
    "mbs",
    "rtp",
    "ref",
    "rl_offload",
    "accum",
)
FORMER_COMMAND = (
    "num_gpus",
    "seq_len",
    "global_batch_size",
    "micro_batch_size",
    "tp",
    "pp",
    "virtual_stages",
    "cp",
    "ep",
    "zero",
    "recompute",
    "offload",
    *RL,
    "precision",
    "optimizer",
    "attention",
    "framework",
)
FORMER_POINT_AXES = (
    "micro_batch_size",
    "seq_len",
    "num_gpus",
    "tp",
    "pp",
    "cp",
    "ep",
    "virtual_stages",
    "zero",
    "recompute",
    "offload",
    "precision",
    "dp",
    "grad_accum_steps",
    "global_batch_size",
    *RL,
)


def test_sweep_lists_equal_their_former_hand_lists() -> None:
    assert _space.AXES == _axes.AXES == FORMER_AXES
    assert _parts.LAYOUT_AXES == _axes.LAYOUT_AXES == FORMER_LAYOUT_AXES
    assert ("gpu", *FORMER_LAYOUT_AXES[1:]) == _parts.LAYOUT
    assert _optuna.INNER_AXES == FORMER_INNER_AXES
    named = ("recompute", "offload", "ref_model", "rl_trainer_offload")
    assert ("pool", *named) == _optuna.CATEGORICAL_AXES
    assert _space._NAMES == {
        "recompute": RECOMPUTE,
        "offload": OFFLOADS,
        "ref_model": REF_MODELS,
        "rl_trainer_offload": RL_TRAINER_OFFLOADS,
    }
    assert list(_space._NAMES) == list(named)
    assert _study.OUTER_AXES == FORMER_LAYOUT_AXES
    assert _axes.RL_AXES == RL
    assert _heatmap.POINT_AXES == FORMER_POINT_AXES
    assert _heatmap.BOOL_AXES == ("sequence_parallel", "activation_offload", "qlora")


def test_table_lists_equal_their_former_hand_lists() -> None:
    from trainmem.cli import _sweep as cli_sweep
    from trainmem.plan import _recommend

    assert cli_sweep.SHOW == FORMER_SHOW
    assert tuple(_axes.heading(c) for c in FORMER_SHOW if c != "dp") == FORMER_SWEEP_HEADS
    assert ("gpu", *FORMER_LAYOUT_AXES[1:]) == _recommend.LAYOUT
    assert (
        "peak_device_bytes",
        *_recommend.LAYOUT,
        "zero",
        "recompute",
        "offload",
        "micro_batch_size",
        *RL,
    ) == _recommend.TIE_BREAK
    assert _recommend.ROW == FORMER_ROW
    assert tuple(_axes.heading(c) for c in _recommend.ROW) == FORMER_HEADS
    # A job without --rl: its tables as they were before the RL axes.
    former = tuple(c for c in FORMER_SHOW if c not in RL)
    assert _axes.shown_columns(FORMER_SHOW, rl=False) == former
    assert _recommend.COMMAND_FIELDS == FORMER_COMMAND


def test_space_values_equal_the_former_axes_dict() -> None:
    from trainmem.catalog import load_model
    from trainmem.hardware import load_gpus, parse_fleet

    gpus = load_gpus()
    space = make_space(
        load_model("llama-3.2-1b"),
        parse_fleet("8xh100-sxm-80gb,4xa100-sxm-80gb", gpus),
        gpus,
        seq_len=1024,
        global_batch_size=32,
    )
    assert tuple(space.axes) == FORMER_AXES
    assert space.axes["zero"] == (0, 1, 2, 3)
    assert space.axes["recompute"] == ("none", "selective", "full")
    assert space.axes["offload"] == ("none", "optimizer", "optimizer+params")
    assert space.axes["virtual_stages"] == (1, 2)


# ---- a knob flipped to a search axis is searched everywhere -----------------------------------

FLIPPED = {
    "attention": {"sweep_axis": True, "layout": True},  # names; a layout axis: Optuna samples it
    "activation_offload": {"sweep_axis": True},  # a switch; enumerated within each trial
}
"""Declared-but-fixed knobs flipped to search axes in the child process (nothing else edited)."""

CHILD = """
import dataclasses, json, sys
import trainmem.engine as engine
from trainmem.engine import _config

for name, attrs in json.loads(sys.argv[2]).items():
    _config.KNOBS[name] = dataclasses.replace(_config.KNOBS[name], **attrs)
engine.SWEEP_AXES = _config.SWEEP_AXES = tuple(n for n, k in _config.KNOBS.items() if k.sweep_axis)

import optuna
import polars as pl
from trainmem.catalog import load_model
from trainmem.hardware import load_gpus, parse_fleet
from trainmem.plan._recommend import recommend_report, summary
from trainmem.results import scan_points, study_dir
from trainmem.sweep._axes import AXES, CATEGORICAL_AXES, INNER_AXES, LAYOUT_AXES, SHOW
from trainmem.sweep._heatmap import POINT_AXES
from trainmem.sweep._exhaustive import run_exhaustive
from trainmem.sweep._optuna import run_optuna
from trainmem.sweep._space import make_space

out = sys.argv[1]
gpus = load_gpus()
space = make_space(
    load_model("llama-3.2-1b"), parse_fleet("8xa100-sxm-40gb", gpus), gpus,
    seq_len=1024, global_batch_size=16, max_micro_batch_size=2, max_pp=1, max_cp=1,
)
space = dataclasses.replace(space, axes={
    **space.axes, "num_gpus": (2, 8), "tp": (1, 2), "virtual_stages": (1,), "zero": (0, 3),
    "recompute": ("none", "full"), "offload": ("none",),
})
exhaustive = run_exhaustive(space, out=out, study="x")
points = scan_points(study_dir(out, "x")).collect()
storage = f"sqlite:///{out}/optuna.db"
run_optuna(space, out=out, study="o", trials=4, batch_size=4, warm_start=False, storage=storage)
study = optuna.load_study(study_name="o", storage=storage)
trials = [t for t in study.get_trials() if t.state.name == "COMPLETE"]  # not layouts drawn again
report = recommend_report(
    model="llama-3.2-1b", fleet="8xa100-sxm-40gb", seq_len=1024, global_batch_size=16,
    max_micro_batch_size=2, max_pp=1, max_cp=1, num_alternatives=3,
)
print(json.dumps({
    "axes": AXES, "layout": LAYOUT_AXES, "inner": INNER_AXES, "categorical": CATEGORICAL_AXES,
    "show": SHOW, "point_axes": POINT_AXES, "space": {k: list(v) for k, v in space.axes.items()},
    "num_points": space.num_points, "stored": points.height,
    "stored_attention": sorted(points["attention"].unique().to_list()),
    "stored_activation_offload": sorted(points["activation_offload"].unique().to_list()),
    "top_columns": exhaustive.top.columns,
    "params": [sorted(t.params) for t in trials],
    "user_attrs": [sorted(t.user_attrs) for t in trials],
    "plan": {k: report.get(k) for k in ("attention", "activation_offload", "estimate_command")},
    "alternatives": [
        {k: p.get(k) for k in ("attention", "activation_offload")} for p in report["alternatives"]
    ],
    "table": summary(report),
}))
"""


def test_a_knob_flipped_to_sweep_axis_is_searched_everywhere(tmp_path: Path) -> None:
    assert not any(KNOBS[name].sweep_axis for name in FLIPPED)  # fixed as shipped
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(tmp_path), json.dumps(FLIPPED)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    # the space: an axis of the flat index, the layout ones leading
    new_inner = [*FORMER_INNER_AXES[:4], "activation_offload", *RL]  # in declaration order
    assert got["axes"] == [*FORMER_LAYOUT_AXES, "attention", *new_inner]
    assert got["layout"] == [*FORMER_LAYOUT_AXES, "attention"]
    assert got["inner"] == new_inner
    assert got["categorical"] == ["pool", "attention", "recompute", "offload", *RL[1:]]
    assert got["space"]["attention"] == list(KNOBS["attention"].choices or ())
    assert got["space"]["activation_offload"] == [False, True]
    # the points table: every point stored with its value of each new axis
    assert got["stored"] == got["num_points"]
    assert got["stored_attention"] == sorted(KNOBS["attention"].choices or ())
    assert got["stored_activation_offload"] == [False, True]
    assert {"attention", "activation_offload"} <= set(got["top_columns"])
    # Optuna: the layout axis suggested, the inner one enumerated (its best told as an attr)
    assert got["params"] and all("attention" in p for p in got["params"])
    assert all("activation_offload" in a for a in got["user_attrs"])
    # the tables: the sweep's columns and recommend's rows, the heatmap of stored points
    assert "attention" in got["show"] and "activation_offload" in got["show"]
    assert {"attention", "activation_offload"} <= set(got["point_axes"])
    plan = got["plan"]
    assert plan["attention"] in KNOBS["attention"].choices
    assert isinstance(plan["activation_offload"], bool)
    assert f"--attention {plan['attention']}" in plan["estimate_command"]
    assert ("--activation-offload" in plan["estimate_command"]) == plan["activation_offload"]
    assert all(set(a) == {"attention", "activation_offload"} for a in got["alternatives"])
    assert all(a["attention"] is not None for a in got["alternatives"])
    assert "attention" in got["table"] and "activation_offload" in got["table"]
