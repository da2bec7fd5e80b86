"""Progress (issue 16): sweeps and Optuna studies draw a bar, traces a spinner, on stderr and
only when stderr is a terminal and the output is not --json; stdout carries the result alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainmem.cli import _progress, main

SWEEP = ["sweep", "--model", "llama-3.2-1b", "--fleet", "8xh100-sxm-80gb", "--seq-len", "2048"]


def _tty(monkeypatch: pytest.MonkeyPatch, value: bool) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: value)
    monkeypatch.setenv("TERM", "xterm")


def test_progress_is_shown_only_on_a_terminal_without_json(monkeypatch: pytest.MonkeyPatch) -> None:
    _tty(monkeypatch, True)
    assert _progress.shown(as_json=False) and not _progress.shown(as_json=True)
    monkeypatch.setenv("TERM", "dumb")
    assert not _progress.shown(as_json=False)
    _tty(monkeypatch, False)
    assert not _progress.shown(as_json=False)


@pytest.mark.parametrize("method", ["exhaustive", "optuna"])
def test_a_terminal_gets_a_bar_on_stderr_and_the_table_on_stdout(
    method: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    seen: list[tuple[int, int]] = []
    real = _progress.progress_bar

    def spy(label: str, *, as_json: bool):  # records what the bar is told
        class Spy:
            def __enter__(self):
                self.inner = real(label, as_json=as_json)
                report = self.inner.__enter__()
                assert report is not None and label == f"{method}: " + (
                    "points" if method == "exhaustive" else "trials"
                )
                return lambda done, total: (seen.append((done, total)), report(done, total))

            def __exit__(self, *exc):
                return self.inner.__exit__(*exc)

        return Spy()

    _tty(monkeypatch, True)
    monkeypatch.setattr("trainmem.cli._sweep.progress_bar", spy)
    argv = [*SWEEP, "--method", method, "--trials", "40", "--out", str(tmp_path / "o")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{method}: ") and "\x1b" not in out
    assert seen and seen[-1][0] == seen[-1][1]  # the bar reached its total


def test_a_pipe_gets_no_progress_at_all(tmp_path: Path) -> None:
    """stderr a pipe (a scheduler, CI, a log): not one progress byte, on either stream."""
    argv = [*SWEEP, "--out", str(tmp_path / "o")]
    done = subprocess.run(
        [sys.executable, "-m", "trainmem.cli", *argv], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("exhaustive: ")
    bad = subprocess.run(
        [sys.executable, "-m", "trainmem.cli", "sweep", "--store", "bogus"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("error: store")


def test_json_on_a_terminal_draws_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _tty(monkeypatch, True)
    assert main([*SWEEP, "--out", str(tmp_path / "o"), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["method"] == "exhaustive" and captured.err == ""
