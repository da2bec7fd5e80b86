"""The README stays true: its commands run, its accuracy table is the generated one."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from trainmem.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _commands() -> list[str]:
    """`trainmem ...` lines of the README's bash/console blocks, continuations joined."""
    out = []
    for block in re.findall(r"```(?:bash|console)\n(.*?)```", README, flags=re.S):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("trainmem "):
                out.append(line.split("#")[0].strip())
    return out


COMMANDS = _commands()


def test_readme_shows_commands() -> None:
    assert len(COMMANDS) >= 4


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_runs(command: str, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(ROOT)
    assert main(shlex.split(command)[1:]) == 0, capsys.readouterr().err


def test_readme_accuracy_table_is_generated() -> None:
    from bench.accuracy import BEGIN, END, markdown

    table = README.split(BEGIN)[1].split(END)[0].strip()
    assert table == markdown().strip(), "run: python -m bench.accuracy --update-readme"


def test_readme_example_output_is_current(capsys) -> None:
    block = re.search(r"```console\n\$ (trainmem estimate.*?)\n(llama.*?)```", README, re.S)
    assert block is not None
    command = block.group(1).replace("\\\n", " ")
    assert main(shlex.split(command)[1:]) == 0
    assert capsys.readouterr().out.strip() == block.group(2).strip()
