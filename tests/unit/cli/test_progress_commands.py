"""recommend and heatmap (issue 27 item 4): a spinner on stderr while they search or draw, only
on a terminal without --json (cli/_progress.py); a pipe or --json gets the result alone."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainmem.cli import _progress, main

RECOMMEND = ["recommend", "--model", "llama-3.2-1b", "--fleet", "8xh100-sxm-80gb"]


def _heatmap(tmp_path: Path) -> list[str]:
    return ["heatmap", "--model", "llama-3.2-1b", "--out", str(tmp_path / "h.png")]


def _tty(monkeypatch: pytest.MonkeyPatch, value: bool) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: value)
    monkeypatch.setenv("TERM", "xterm")


def _spy(monkeypatch: pytest.MonkeyPatch, module: str) -> list[tuple[str, bool]]:
    """Records each spinner the command opens: (label, whether it is drawn)."""
    seen: list[tuple[str, bool]] = []
    real = _progress.spinner

    @contextlib.contextmanager
    def spy(label: str, *, as_json: bool) -> Iterator[None]:
        seen.append((label, _progress.shown(as_json=as_json)))
        with real(label, as_json=as_json):
            yield

    monkeypatch.setattr(f"trainmem.cli.{module}.spinner", spy)
    return seen


@pytest.mark.parametrize("command", ["recommend", "heatmap"])
def test_a_terminal_gets_a_spinner_and_stdout_the_result(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    seen = _spy(monkeypatch, f"_{command}")
    _tty(monkeypatch, True)
    argv = RECOMMEND if command == "recommend" else _heatmap(tmp_path)
    assert main(argv) == 0
    out = capsys.readouterr().out
    label = "recommend: searching 8xh100-sxm-80gb" if command == "recommend" else "heatmap: "
    assert len(seen) == 1 and seen[0][0].startswith(label) and seen[0][1]
    assert out.startswith("llama-3.2-1b on" if command == "recommend" else "wrote ")
    assert "\x1b" not in out


@pytest.mark.parametrize("command", ["recommend", "heatmap"])
def test_json_on_a_terminal_draws_nothing(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    seen = _spy(monkeypatch, f"_{command}")
    _tty(monkeypatch, True)
    argv = RECOMMEND if command == "recommend" else _heatmap(tmp_path)
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    assert [drawn for _, drawn in seen] == [False]
    assert json.loads(captured.out) and captured.err == ""


def test_recommend_format_json_counts_as_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = _spy(monkeypatch, "_recommend")
    _tty(monkeypatch, True)
    assert main([*RECOMMEND, "--format", "json"]) == 0
    assert [drawn for _, drawn in seen] == [False] and capsys.readouterr().err == ""


@pytest.mark.parametrize("command", ["recommend", "heatmap"])
def test_a_pipe_gets_no_progress(command: str, tmp_path: Path) -> None:
    argv = RECOMMEND if command == "recommend" else _heatmap(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "trainmem.cli", *argv], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stderr == "" and "\x1b" not in done.stdout
