"""The exit-code contract (docs/exit-codes.md): 0 ran, 1 with --check and no fit, 2 bad input;
and the --where grammar (an expression over the columns, nothing else)."""

from __future__ import annotations

import pytest

from trainmem.cli import main
from trainmem.results._query import check_where

BIG = ["--model", "llama-3.1-70b", "--gpu", "l4-24gb"]


@pytest.mark.parametrize("command", ["estimate", "fit"])
def test_check_turns_no_fit_into_exit_1(capsys, command) -> None:
    assert main([command, *BIG]) == 0
    assert main([command, *BIG, "--check"]) == 1
    assert main([command, "--model", "llama-3.2-1b", "--check"]) == 0
    capsys.readouterr()


def test_help_states_the_contract(capsys) -> None:
    for command in ("estimate", "fit", "recommend", "sweep", "points", "heatmap", "models"):
        with pytest.raises(SystemExit):
            from trainmem.cli._app import app

            app([command, "--help"], prog_name="trainmem")
        assert "Exit codes" in capsys.readouterr().out


COLUMNS = ("fits", "num_gpus", "gpu", "zero", "peak_device_bytes")


@pytest.mark.parametrize(
    "where",
    [
        "fits",
        "fits AND num_gpus <= 16",
        "NOT fits OR (zero = 3 AND peak_device_bytes > 1e9)",
        "gpu IN ('h100-sxm-80gb', 'a100''s') AND num_gpus BETWEEN 2 AND 8",
        "gpu LIKE 'h%' AND \"zero\" IS NOT NULL",
    ],
)
def test_where_accepts_expressions_over_the_columns(where) -> None:
    check_where(where, COLUMNS)


@pytest.mark.parametrize(
    ("where", "named"),
    [
        ("fits AND (SELECT 1) = 1", "SELECT"),
        ("read_parquet('/etc/passwd') IS NULL", "read_parquet"),
        ("scan_csv('x')", "scan_csv"),
        ("fits; DROP TABLE points", ";"),
        ("fits -- x", "comments"),
        ("fits /* x */", "comments"),
        ("fits(1)", "fits(...)"),
        ("nope = 1", "nope"),
    ],
)
def test_where_refuses_the_rest(where, named) -> None:
    with pytest.raises(ValueError, match="^--where: ") as error:
        check_where(where, COLUMNS)
    assert named in str(error.value)
