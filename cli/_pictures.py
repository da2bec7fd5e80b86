"""`trainmem estimate --plot` / `--memory-viz`: the step timeline of an estimate report drawn
(results/_timeline_plot.py) or written as a PyTorch memory snapshot; imported only when one of
them is asked for (matplotlib stays out of a plain estimate)."""

from __future__ import annotations

from typing import Any

import typer

from trainmem.report import (
    MEMORY_VIZ_SUFFIXES,
    PLOT_FORMATS,
    TIMELINE_COMPONENTS,
    memory_snapshot,
    model_spec,
    picture_suffix,
    stage_blocks,
    step_timeline,
)


def check_pictures(plot: str | None, memory_viz: str | None) -> None:
    """One-line ValueError for a bad extension, before any estimate runs."""
    if plot is not None:
        picture_suffix("--plot", plot, PLOT_FORMATS)
    if memory_viz is not None:
        picture_suffix("--memory-viz", memory_viz, MEMORY_VIZ_SUFFIXES)


def write_pictures(
    report: dict[str, Any], options: dict[str, Any], *, plot: str | None, memory_viz: str | None
) -> None:
    """The timeline of `report` (the worst rank's stage of the model `options` name) drawn to
    `plot` and/or written to `memory_viz`; one line on stderr per file written."""
    from trainmem.results._timeline_plot import write_pickle, write_timeline_plot

    spec = model_spec(
        options["model"],
        models_dir=options.get("models_dir"),
        profile_file=options.get("profile_file"),
        family=options.get("family"),
    )
    num_blocks = stage_blocks(spec.num_hidden_layers, report["config"]["pp"])
    timeline = step_timeline(report, num_blocks=num_blocks)
    if plot is not None:
        fmt = picture_suffix("--plot", plot, PLOT_FORMATS)
        write_timeline_plot(timeline, plot, components=TIMELINE_COMPONENTS, fmt=fmt)
        typer.echo(f"wrote {plot}: the step's memory over time", err=True)
    if memory_viz is not None:
        write_pickle(memory_snapshot(timeline), memory_viz)
        typer.echo(f"wrote {memory_viz}: the step as a PyTorch memory snapshot", err=True)
