"""`trainmem --version` (issue 27 item 4): the installed version, exit 0, before any command."""

from __future__ import annotations

from importlib.metadata import version

from trainmem.cli import main


def test_version_prints_the_installed_version(capsys) -> None:
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out == f"trainmem {version('trainmem')}\n"


def test_version_answers_before_a_command_runs(capsys) -> None:
    """Eager: with a command after it (even a bad one) the version is all that happens."""
    assert main(["--version", "estimate", "--micro-batch-size", "-1"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("trainmem ") and captured.err == ""
