"""`sweep` refuses bad options before it creates anything: one line naming the field, exit 2,
no output folder (`--objective cost,time,gpus` and `--seed -1` created it before)."""

from __future__ import annotations

import pytest

from trainmem.cli import main

SMALL = ["--model", "llama-3.2-1b", "--fleet", "8xa100-sxm-40gb", "--max-pp", "2"]


@pytest.mark.parametrize(
    ("argv", "starts"),
    [
        (["--objective", "cost,time,gpus"], "error: objective: at most two objectives"),
        (["--objective", "cost,cost"], "error: objective: 'cost' given twice"),
        (["--seed", "-1"], "error: seed: must be in [0, 4294967295], got -1"),
        (["--method", "optuna", "--seed", "-1"], "error: seed: must be in [0, 4294967295]"),
        (["--method", "optuna", "--seed", str(2**32)], "error: seed: must be in"),
        (["--method", "optuna", "--jobs", "2"], "error: --jobs applies to --method exhaustive"),
        (["--method", "optuna", "--store", "fits"], "error: --store applies to"),
        (["--workers", "2"], "error: --storage and --workers apply to --method optuna"),
    ],
)
def test_refused_before_anything_is_created(capsys, tmp_path, argv, starts) -> None:
    out = tmp_path / "out"
    assert main(["sweep", *SMALL, *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(starts) and err.count("\n") == 1, err
    assert not out.exists()
