"""Start-up stays light: `trainmem estimate` and `fit` never import the heavy libraries that only
sweep, points, heatmap and serve use; those commands still import what they need when run.

Each case runs the CLI in a fresh interpreter (an import made by another test would hide one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainmem.cli._app import LAZY_COMMANDS

HEAVY = ("polars", "pyarrow", "matplotlib", "fastapi", "uvicorn", "optuna", "joblib", "numba")
"""Libraries of the searches, the points table, the plots and the HTTP service (and the compiled
engine kernel, for large grids only): each costs tens to hundreds of milliseconds to import."""

RUN = """
import contextlib, io, json, sys
from trainmem.cli import main
codes = []
with contextlib.redirect_stdout(io.StringIO()) as out:
    for argv in json.loads(sys.argv[1]):
        codes.append(main(argv))
named = set(json.loads(sys.argv[2]))
loaded = sorted(n for n in sys.modules if n in named or n.split(".")[0] in named)
print(json.dumps({"codes": codes, "output": out.getvalue(), "loaded": loaded}))
"""
"""Runs CLI steps (argv lists) in process, then prints their exit codes, their output and which
of the named modules (or packages, with their submodules) are loaded."""


def _run_cli(steps: list[list[str]], cwd: Path, names: tuple[str, ...] = HEAVY) -> dict:
    # No user settings (TRAINMEM_KERNEL=numba would load numba on purpose).
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINMEM_")}
    result = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(steps), json.dumps(names)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "--model", "llama-2-7b"],
        ["estimate", "--model", "llama-2-7b", "--json"],
        ["fit", "--model", "llama-2-7b"],
    ],
)
def test_estimate_and_fit_import_nothing_heavy(argv: list[str], tmp_path: Path) -> None:
    run = _run_cli([argv], tmp_path)
    assert run["codes"] == [0]
    assert "h100-sxm-80gb" in run["output"]  # the default GPU
    assert run["loaded"] == []


OTHER_COMMANDS = tuple(f"trainmem.cli.{module[1:]}" for module in set(LAZY_COMMANDS.values()))
"""The modules of every command but estimate: `trainmem estimate` neither imports them nor has
typer build their options (typer reads every registered command's signature)."""


def test_estimate_builds_no_other_command(tmp_path: Path) -> None:
    run = _run_cli([["estimate", "--model", "llama-2-7b"]], tmp_path, names=OTHER_COMMANDS)
    assert run["codes"] == [0]
    assert run["loaded"] == []


@pytest.mark.parametrize(
    ("argv", "expected"),
    [(["models"], "llama-2-7b"), (["optimizers"], "adamw"), (["gpus"], "h100-sxm-80gb")],
)
def test_listings_still_run_when_named(argv: list[str], expected: str, tmp_path: Path) -> None:
    run = _run_cli([argv], tmp_path, names=OTHER_COMMANDS)
    assert run["codes"] == [0]
    assert expected in run["output"]
    assert run["loaded"] == ["trainmem.cli._lists"]


def test_help_imports_nothing_heavy(tmp_path: Path) -> None:
    run = _run_cli([["--help"]], tmp_path)
    assert run["codes"] == [0]
    assert "heatmap" in run["output"]
    assert run["loaded"] == []


def test_sweep_and_points_still_import_what_they_run(tmp_path: Path) -> None:
    out = str(tmp_path / "points")
    sweep = [
        "sweep",
        "--model",
        "gpt2",
        "--fleet",
        "2xt4-16gb",
        "--seq-len",
        "1024",
        "--global-batch-size",
        "32",
        "--max-pp",
        "1",
        "--max-cp",
        "1",
        "--max-micro-batch-size",
        "4",
        "--out",
        out,
        "--json",
    ]
    run = _run_cli([sweep, ["points", out, "--head", "3", "--json"]], tmp_path)
    assert run["codes"] == [0, 0]
    assert '"micro_batch_size"' in run["output"]
    assert "polars" in run["loaded"]
