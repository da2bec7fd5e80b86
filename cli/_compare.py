"""`trainmem compare`: one configuration as estimate takes it, and a second one that is the
first with the estimate flags of `--vs` applied (`--vs "--zero 3 --recompute full"`), side by
side (report/_compare.py). The flags of --vs are parsed by estimate's own command, so they are
the same flags with the same checks.
"""

from __future__ import annotations

import shlex
from typing import Any

import typer

from trainmem.engine import FIELD_NAMES
from trainmem.report import AS_JSON, ESTIMATE_OPTIONS, EXIT_CODES, Option, check_options, json_text
from trainmem.report._compare import compare_report, compare_table

from ._options import command

VS = Option(
    name="vs",
    type=str | None,
    default=None,
    http=False,
    help=(
        'The second configuration: estimate flags applied to the first, quoted (--vs "--zero 3 '
        '--recompute full").'
    ),
)
NOT_COMPARED = ("as_json", "check", "per_stage")
"""Estimate's options that print, not configure: neither side takes them."""

COMPARE_OPTIONS = (*(o for o in ESTIMATE_OPTIONS if o.name not in NOT_COMPARED), VS, AS_JSON)


def _vs_values(vs: str) -> dict[str, Any]:
    """The options `vs` sets, parsed by the estimate command (its types, choices, checks)."""
    from ._app import app

    estimate = typer.main.get_command(app).commands["estimate"]  # type: ignore[attr-defined]
    try:
        ctx = estimate.make_context("estimate", shlex.split(vs))
    except ValueError as exc:
        raise ValueError(f"vs: {exc}") from None
    except Exception as exc:
        if not hasattr(exc, "format_message"):
            raise
        raise ValueError(f"vs: {' '.join(str(exc.format_message()).split())}") from None
    given = {
        k: v
        for k, v in ctx.params.items()
        if ctx.get_parameter_source(k).name == "COMMANDLINE"  # type: ignore[union-attr]
    }
    printing = sorted(set(given) & {*NOT_COMPARED, "plot", "memory_viz"})
    if printing:
        flags = {o.name: o.flag for o in ESTIMATE_OPTIONS if o.flag}
        flag = flags.get(printing[0], "--" + printing[0].replace("_", "-"))
        raise ValueError(f"vs: {flag} changes what is printed, not the configuration")
    return given


def _split(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(training fields, estimate's other options) of one side."""
    training = {k: v for k, v in values.items() if k in FIELD_NAMES}
    return training, {k: v for k, v in values.items() if k not in FIELD_NAMES}


@command(COMPARE_OPTIONS)
def compare_cmd(training: dict[str, Any], *, as_json: bool, vs: str | None, **options: Any) -> None:
    """Two configurations side by side: breakdowns, phase peaks and their differences."""
    if not vs:
        raise ValueError('vs: give the second configuration, e.g. --vs "--zero 3"')
    first = {**training, **options}
    second = {**first, **_vs_values(vs)}
    try:
        check_options(ESTIMATE_OPTIONS, dict(second))
    except ValueError as exc:
        raise ValueError(f"vs: {exc}") from None
    result = compare_report(_split(first), _split(second))
    result["vs"] = shlex.split(vs)
    typer.echo(json_text(result) if as_json else compare_table(result))


def register(app: typer.Typer) -> None:
    """Add `compare` to the CLI app."""
    app.command("compare", epilog=EXIT_CODES)(compare_cmd)
