"""`trainmem completion bash|zsh|fish|powershell`: the shell's completion script, printed.

The script (typer's) calls `trainmem` back with _TRAINMEM_COMPLETE set; the answers are the
commands, their options, the choices of an option with a fixed set and, for --model, --gpu and
--optimizer, the catalogue's names (cli/_options.py NAME_COMPLETERS). Nothing is fetched and
nothing is written: `eval "$(trainmem completion bash)"` in ~/.bashrc installs it.
"""

from __future__ import annotations

from typing import Annotated

import typer

from trainmem.report import EXIT_CODES

SHELLS = ("bash", "zsh", "fish", "powershell")
PROG_NAME = "trainmem"
COMPLETE_VAR = "_TRAINMEM_COMPLETE"
"""The variable the script sets when it calls trainmem for completions (click's convention)."""


def completion_script(shell: str) -> str:
    """The completion script of `shell` (one of SHELLS) for the `trainmem` command."""
    from typer._completion_classes import completion_init
    from typer._completion_shared import get_completion_script

    from trainmem.report import choice

    choice("shell", shell, SHELLS)
    completion_init()  # registers typer's shell classes and their scripts
    return get_completion_script(prog_name=PROG_NAME, complete_var=COMPLETE_VAR, shell=shell)


def completion_cmd(
    shell: Annotated[
        str,
        typer.Argument(
            metavar="|".join(SHELLS),
            help='The shell. Install: eval "$(trainmem completion bash)" in ~/.bashrc.',
            autocompletion=lambda incomplete: [s for s in SHELLS if s.startswith(incomplete)],
        ),
    ],
) -> None:
    """Print the shell completion script (commands, options, choices, model and GPU names)."""
    typer.echo(completion_script(shell))


def register(app: typer.Typer) -> None:
    """Add `completion` to the CLI app."""
    app.command("completion", epilog=EXIT_CODES)(completion_cmd)
