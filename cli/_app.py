"""The `trainmem` command line (typer): estimate; the others register from their modules
(models, optimizers, trace, gpus, fit, sweep, points, recommend, heatmap, serve, explain, ...),
imported and built only when their command is named (LAZY_COMMANDS).

Exit codes (every command, report.EXIT_CODES, docs/exit-codes.md): 0 the command ran; 1 with
--check when it does not fit; 2 bad input (one line naming the field and the allowed values on
stderr, no traceback).
"""

from __future__ import annotations

import errno
import importlib
import os
import re
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Annotated, Any

import typer
import typer.main
from typer.core import TyperGroup

from trainmem.hardware._files import shown_path
from trainmem.report import (
    ESTIMATE_OPTIONS,
    EXIT_CODES,
    PICTURE_OPTIONS,
    estimate_report,
    human_table,
    json_text,
)

from ._options import command, dress

LAZY_COMMANDS = {
    "models": "._lists",
    "optimizers": "._lists",
    "trace": "._trace",
    "gpus": "._lists",
    "fit": "._fit",
    "sweep": "._sweep",
    "points": "._sweep",
    "recommend": "._recommend",
    "serve": "._serve",
    "heatmap": "._heatmap",
    "check": "._check",
    "compare": "._compare",
    "explain": "._explain",
    "completion": "._completion",
}
"""Commands built from their module (its `register(app)`) when named, after this file's own
(in this order in `--help`): `trainmem estimate` neither imports what they run (polars, Optuna,
FastAPI, ...) nor has typer build their options."""


class _Commands(MutableMapping[str, Any]):
    """A group's commands by name, in order; a LAZY_COMMANDS one is built when looked up."""

    def __init__(self, built: Mapping[str, Any]) -> None:
        self._commands: dict[str, Any] = {**built, **dict.fromkeys(LAZY_COMMANDS)}

    def __getitem__(self, name: str) -> Any:
        if self._commands[name] is None:
            self._commands[name] = _build_command(name)
        return self._commands[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._commands[name] = command

    def __delitem__(self, name: str) -> None:
        del self._commands[name]

    def __contains__(self, name: object) -> bool:
        return name in self._commands  # without building it

    def __iter__(self) -> Iterator[str]:
        return iter(self._commands)

    def __len__(self) -> int:
        return len(self._commands)


class _LazyGroup(TyperGroup):
    """The `trainmem` group: click's lazily loaded subcommands, on typer's group."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        dress(self)
        self.commands = _Commands({k: dress(c) for k, c in self.commands.items()})

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # the names, without building every command


def _build_command(name: str) -> Any:
    """The click command `name` of LAZY_COMMANDS, as typer builds the group's own."""
    registry = typer.Typer()
    importlib.import_module(LAZY_COMMANDS[name], __package__).register(registry)
    (info,) = (c for c in registry.registered_commands if c.name == name)
    return dress(
        typer.main.get_command_from_info(
            info,
            pretty_exceptions_short=app.pretty_exceptions_short,
            rich_markup_mode=app.rich_markup_mode,
        )
    )


app = typer.Typer(
    cls=_LazyGroup,
    add_completion=False,  # `trainmem completion SHELL` prints the script instead
    no_args_is_help=True,
    help="Predict the per-GPU memory of a training job before it runs.",
)


def _print_version(value: bool) -> None:
    """`trainmem --version`: the installed distribution's version, then exit 0."""
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("trainmem")
    except PackageNotFoundError:  # run from a source tree that was never installed
        installed = "(not installed)"
    typer.echo(f"trainmem {installed}")
    raise typer.Exit()


@app.callback()
def _group(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print trainmem's version and exit.",
        ),
    ] = False,
) -> None:
    # A callback keeps `trainmem` a group of commands although `estimate` is its only command
    # registered up front (typer makes a lone command the whole program); its one option is
    # --version (eager: it answers before any command runs).
    pass


@app.command("estimate", epilog=EXIT_CODES)
@command((*ESTIMATE_OPTIONS, *PICTURE_OPTIONS))
def estimate_cmd(
    training: dict[str, Any],
    *,
    as_json: bool,
    check: bool,
    plot: str | None = None,
    memory_viz: str | None = None,
    **options: Any,
) -> None:
    """Per-device memory of one training configuration: breakdown, phase peaks, fit."""
    pictures = plot is not None or memory_viz is not None
    if pictures:  # its module (and matplotlib) only when asked for
        from ._pictures import check_pictures

        check_pictures(plot, memory_viz)
    report = estimate_report(training, **options)
    for warning in report.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    if as_json:
        typer.echo(json_text(report))
    else:
        typer.echo(human_table(report))
        if "risk" in report:  # --lengths
            from trainmem.report._risk import risk_line

            typer.echo(risk_line(report["risk"]))
    if pictures:
        from ._pictures import write_pictures

        write_pictures(report, options, plot=plot, memory_viz=memory_viz)
    if check and not report["fits"]:
        raise typer.Exit(1)


MAX_SHOWN_WORD_CHARS = 120
"""An error line shows a longer run of characters without a space (a 10,000-character value
echoed back) with its middle elided, as hardware's shown_path shows a long path."""
MAX_ERROR_LINE_CHARS = 1_500
"""The longest error line: the field, the reason and the allowed values (the GPU list is about
700 characters); past it the middle is elided."""


def error_line(message: str) -> str:
    """The one stderr line of bad input: `error: ` and the message's first line, each word past
    MAX_SHOWN_WORD_CHARS and the line past MAX_ERROR_LINE_CHARS cut in the middle."""
    first = (message.splitlines() or [""])[0]
    first = re.sub(
        rf"\S{{{MAX_SHOWN_WORD_CHARS + 1},}}", lambda m: f"{m[0][:60]}...{m[0][-40:]}", first
    )
    if len(first) > MAX_ERROR_LINE_CHARS:
        first = f"{first[: MAX_ERROR_LINE_CHARS - 303]}...{first[-300:]}"
    return f"error: {first}"


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: one-line errors, exit code 2 on bad input.

    typer vendors its own click in recent releases, so click's exceptions are matched by their
    interface (`exit_code`, `format_message`) rather than by class.
    """
    if "_TRAINMEM_COMPLETE" in os.environ:  # a shell asks (cli/_completion.py COMPLETE_VAR)
        from typer._completion_classes import completion_init

        completion_init()  # typer's shells: registered by add_completion, which is off
    try:
        # Not standalone, click returns typer.Exit's code instead of raising it.
        code = app(args=argv, standalone_mode=False)
    except ValueError as exc:
        print(error_line(str(exc)), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        if exc.errno not in (errno.ENAMETOOLONG, errno.ELOOP):  # a name the user gave
            raise
        name = shown_path(exc.filename) if exc.filename else "a path"
        print(f"error: {name}: {exc.strerror}", file=sys.stderr)
        return 2
    except Exception as exc:
        if type(exc).__name__ == "Exit":
            return int(getattr(exc, "exit_code", 0) or 0)
        if type(exc).__name__ == "Abort":
            print("error: aborted", file=sys.stderr)
            return 130
        if hasattr(exc, "format_message"):
            message = " ".join(str(exc.format_message()).split())
            if message:
                print(error_line(message), file=sys.stderr)
            return int(getattr(exc, "exit_code", 2) or 2)
        raise
    return code if isinstance(code, int) else 0


def run() -> None:
    """The `trainmem` console script: main() on sys.argv, its code as the exit status."""
    sys.exit(main())
