"""Faults around a sweep are one line each, never a traceback: a full disk under `sweep --out`,
a read-only `heatmap --out`, a corrupted SQLite study; and sweeps starting together on one new
SQLite file all run (Optuna creates its tables without a lock)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from trainmem.cli import main
from trainmem.results import _plot, _store
from trainmem.sweep._optuna import run_optuna, storage_errors

sys.path.insert(0, str(Path(__file__).parent))
from test_search import small_space  # noqa: E402

SWEEP = ["sweep", "--model", "llama-3.2-1b", "--fleet", "8xa100-sxm-40gb", "--seq-len", "2048"]
SWEEP += ["--global-batch-size", "32", "--max-pp", "2", "--max-cp", "1"]
HEATMAP = ["heatmap", "--model", "llama-3.2-1b", "--gpu", "h100", "--x-values", "1,2"]
HEATMAP += ["--y-values", "512"]


def _one_line_error(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def _disk_full_in_polars(*args, **kwargs):
    """What polars raises when the disk fills while it writes a part (seen on /dev/full)."""
    raise pl.exceptions.ComputeError(
        "parquet: File out of specification: underlying IO error: No space left on device "
        "(os error 28)"
    )


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("target", ["_write_parquet_file", "_fsync"])
def test_a_full_disk_under_sweep_out_is_one_line(capsys, tmp_path, monkeypatch, target) -> None:
    fault = _disk_full_in_polars if target == "_write_parquet_file" else _disk_full
    monkeypatch.setattr(_store, target, fault)
    out = tmp_path / "out"
    err = _one_line_error(capsys, [*SWEEP, "--out", str(out)])
    assert err.startswith(f"error: out: {str(out)!r}: No space left on device")
    folder = out / "points"
    assert not list(folder.rglob("part-*.parquet")) and not list(folder.rglob(".tmp-*"))


def test_a_read_only_heatmap_out_is_one_line(capsys, tmp_path, monkeypatch) -> None:
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(_plot.tempfile, "mkstemp", read_only)
    path = tmp_path / "h.png"
    err = _one_line_error(capsys, [*HEATMAP, "--out", str(path)])
    assert err == f"error: out: {str(path)!r}: Read-only file system\n"
    assert not path.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a 0o500 folder")
def test_an_unwritable_heatmap_folder_is_one_line(capsys, tmp_path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    try:
        err = _one_line_error(capsys, [*HEATMAP, "--out", str(folder / "h.png")])
        assert err.startswith(f"error: out: {str(folder / 'h.png')!r}: Permission denied")
    finally:
        folder.chmod(0o700)


def test_a_garbage_sqlite_study_is_one_line(tmp_path) -> None:
    db = tmp_path / "study.db"
    db.write_bytes(b"\x00garbage\xff" * 600)
    with pytest.raises(ValueError, match=r"^storage: .*not a database") as raised:
        run_optuna(small_space(), out=tmp_path, study="o", trials=2, storage=f"sqlite:///{db}")
    assert "\n" not in str(raised.value)


def test_storage_errors_while_a_study_runs_are_one_line() -> None:
    from sqlalchemy.exc import OperationalError

    url = "sqlite:////data/study.db"
    full = OperationalError("INSERT ...", {}, Exception("database or disk is full"))
    cases = [
        (full, ValueError, r"^storage: sqlite:////data/study.db: .*disk is full"),
        (b"\xff", ValueError, r"^storage: sqlite:////data/study.db: damaged: "),
        (ValueError("trials: mine"), ValueError, "^trials: mine$"),  # ours pass unchanged
        (KeyError("not a storage's"), KeyError, "not a storage's"),
    ]
    for raised, expected, message in cases:
        with pytest.raises(expected, match=message), storage_errors(url):
            if isinstance(raised, bytes):
                raised.decode()
            raise raised


STARTER = """
import sys, time
sys.path.insert(0, {tests!r})
from test_search import small_space
from trainmem.sweep._optuna import run_optuna, storage_errors
space = small_space(tiny=True)
time.sleep(max(0.0, {at!r} - time.time()))  # every process opens the new file at once
run_optuna(space, out={out!r}, study={study!r}, trials=2, storage={url!r}, warm_start=False)
"""


def test_sweeps_starting_together_on_one_new_sqlite_file_all_run(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    at = time.time() + 8.0  # after every process has imported trainmem and optuna
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                STARTER.format(
                    tests=str(Path(__file__).parent),
                    at=at,
                    out=str(tmp_path / f"o{i}"),
                    study=f"s{i}",
                    url=url,
                ),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    errors = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        errors.append((proc.returncode, err.strip().splitlines()[-1:]))
    assert errors == [(0, [])] * 4
