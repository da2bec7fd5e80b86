"""typer options made from the commands' declared options (trainmem.report.Option).

`command(options)` turns a function taking `(training, **other)` into a typer command whose
signature is the declared options: the training configuration's fields (collected into
`training`, a dict of the values given) and the command's own (passed by name). Nothing about a
field is written here: its type, default, help and choices come from the declaration.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer

from trainmem.engine import FIELD_NAMES
from trainmem.report import Option, check_options


def typer_parameter(option: Option) -> inspect.Parameter:
    """The keyword parameter typer reads for one option (Annotated type + typer.Option)."""
    help_text = option.help
    if option.choices and "|" not in help_text:
        help_text = f"{help_text} ({'|'.join(option.choices)})"
    decls = (option.flag,) if option.flag else ()
    if option.type is bool and option.default is True and option.flag and "/" not in option.flag:
        decls = (f"{option.flag}/--no-{option.flag.removeprefix('--')}",)  # on by default
    annotation = Annotated[option.type, typer.Option(*decls, help=help_text)]
    return inspect.Parameter(
        option.name, inspect.Parameter.KEYWORD_ONLY, default=option.default, annotation=annotation
    )


def command(options: Sequence[Option]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the typer command of `options`; the function gets (training, **the rest)."""

    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def run(**values: Any) -> Any:
            check_options(options, values)
            training = {k: values.pop(k) for k in FIELD_NAMES if k in values}
            return function(training, **values)

        parameters = [typer_parameter(o) for o in options]
        run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in parameters}
        run.options = tuple(options)  # type: ignore[attr-defined]
        return run

    return wrap
