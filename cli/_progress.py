"""Progress shown while a long command runs: a rich bar (sweeps, Optuna studies: they report
points or trials as they go) or a spinner (traces, recommend, heatmap: one search or one
vectorized call with nothing to count) on stderr, and only when stderr is a terminal and the
output is not `--json`: a pipe, a log file or a scheduler reading stdout gets the result alone,
byte for byte."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator

Report = Callable[[int, int], None]
"""report(done, total)."""


def shown(*, as_json: bool) -> bool:
    """Whether to draw progress: stderr is a terminal, no --json, and TERM is not ``dumb``."""
    return not as_json and sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


@contextlib.contextmanager
def progress_bar(label: str, *, as_json: bool) -> Iterator[Report | None]:
    """A transient bar on stderr for `label` ("exhaustive: points"); yields its report(done,
    total), or None when progress is not shown (`shown`)."""
    if not shown(as_json=as_json):
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=None)

        def report(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield report


@contextlib.contextmanager
def spinner(label: str, *, as_json: bool) -> Iterator[None]:
    """A transient spinner with `label` on stderr while the block runs (when `shown`)."""
    if not shown(as_json=as_json):
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(label):
        yield
