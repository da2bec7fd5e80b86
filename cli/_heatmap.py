"""`trainmem heatmap`: two knobs on the axes, colour = peak device memory (trainmem.sweep)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from trainmem.engine import grid_columns
from trainmem.hardware import GIB
from trainmem.report import (
    AS_JSON,
    EXIT_CODES,
    GPU,
    HEADROOM,
    JOB_DEFAULT_MODEL,
    JOB_DEFAULTS,
    OVERHEAD_OPTIONS,
    USER_DIRS,
    Option,
    check_headroom,
    json_text,
    training_options,
)

from ._options import command
from ._progress import spinner

if TYPE_CHECKING:
    from trainmem.sweep._heatmap import Plot

HEATMAP_OPTIONS: tuple[Option, ...] = (
    Option(
        name="model",
        type=str | None,
        default=None,
        help=f"Preset name or HF config.json path; default {JOB_DEFAULT_MODEL}.",
    ),
    Option(
        name="gpu",
        type=str | None,
        default=None,
        help=f"GPU profile (`trainmem gpus`); default {GPU.default}.",
    ),
    Option(
        name="x",
        type=str,
        default="micro_batch_size",
        flag="--x",
        help="Field on the x axis (listed above).",
    ),
    Option(name="y", type=str, default="seq_len", flag="--y", help="Field on the y axis."),
    Option(
        name="x_values",
        type=str | None,
        default=None,
        help="Comma list of x values (default: a range per field).",
    ),
    Option(name="y_values", type=str | None, default=None, help="Comma list of y values."),
    Option(name="out", type=str, default="heatmap.png", help="Image file: .png or .svg."),
    Option(
        name="points",
        type=str | None,
        default=None,
        help="Draw stored points (a sweep's --out folder): best point per cell.",
    ),
    Option(
        name="where",
        type=str | None,
        default=None,
        help='With --points: SQL WHERE clause, e.g. "zero = 3".',
    ),
    *training_options(defaults=JOB_DEFAULTS),
    HEADROOM,
    *USER_DIRS,
    *OVERHEAD_OPTIONS,
    AS_JSON,
)


@command(HEATMAP_OPTIONS)
def heatmap_cmd(
    training: dict[str, Any],
    *,
    model: str | None,
    gpu: str | None,
    x: str,
    y: str,
    x_values: str | None,
    y_values: str | None,
    out: str,
    points: str | None,
    where: str | None,
    headroom: float,
    hardware_dir: str | None,
    models_dir: str | None,
    optimizers_dir: str | None,
    overhead: list[str] | None,
    overhead_file: str | None,
    as_json: bool,
) -> None:
    """Fit/no-fit heatmap of two knobs: peak device memory per GPU and the fit boundary.

    Colour = peak device memory per GPU (GiB), a line at the GPU's usable memory less the
    headroom. Axes: micro_batch_size, seq_len, num_gpus, tp, pp,
    cp, ep, virtual_stages, zero, lora_rank, recompute, offload, precision, optimizer,
    attention, framework, loss, sequence_parallel, activation_offload, qlora (--points: also
    dp, grad_accum_steps, global_batch_size). With --points the other settings come from the
    points and each cell shows its best point (smallest peak that fits, else smallest peak);
    the configuration flags are then ignored (--overhead and --overhead-file are refused: the
    points hold the overheads they were evaluated with). PNG, or SVG by extension.
    """
    # polars and matplotlib: imported when the command runs, not when it is registered.
    from trainmem.results import heatmap_format
    from trainmem.sweep._heatmap import Plot, closest_cell_advice

    fmt = heatmap_format(out)
    plot = Plot(
        x=x,
        y=y,
        x_text=x_values,
        y_text=y_values,
        out=out,
        headroom=check_headroom(headroom),
        hardware_dir=hardware_dir,
    )
    with spinner(f"heatmap: {x} x {y}", as_json=as_json):
        report = _cells_report(
            plot,
            training,
            model=model,
            gpu=gpu,
            points=points,
            where=where,
            models_dir=models_dir,
            optimizers_dir=optimizers_dir,
            overhead=overhead,
            overhead_file=overhead_file,
        )
        if points is None:  # nothing fits: what to change, from the closest cell
            report.update(
                closest_cell_advice(
                    report,
                    training,
                    model=model or JOB_DEFAULT_MODEL,
                    gpu=gpu or GPU.default,
                    headroom=plot.headroom,
                    hardware_dir=hardware_dir,
                    models_dir=models_dir,
                    optimizers_dir=optimizers_dir,
                    overhead=overhead,
                    overhead_file=overhead_file,
                )
            )
    report["format"] = fmt
    _echo_report(report, x=x, y=y, as_json=as_json)


def _cells_report(
    plot: Plot,
    training: dict[str, Any],
    *,
    model: str | None,
    gpu: str | None,
    points: str | None,
    where: str | None,
    models_dir: str | None,
    optimizers_dir: str | None,
    overhead: list[str] | None,
    overhead_file: str | None,
) -> dict[str, Any]:
    """The heatmap's report from stored points (--points, --where) or from the flags; each
    source refuses the other's options, which it would otherwise ignore silently."""
    from trainmem.sweep._heatmap import from_flags, from_points

    if points is not None:
        if model is not None or gpu is not None:
            raise ValueError(
                "--model/--gpu: with --points they come from the points; "
                "select them with --where \"gpu = 'NAME'\""
            )
        if overhead or overhead_file is not None:
            raise ValueError(
                "--overhead/--overhead-file: with --points the points hold the overheads they "
                "were evaluated with; give them to the sweep that stored the points"
            )
        return from_points(plot, points, where=where)
    if where is not None:
        raise ValueError("--where: applies to --points only")
    config: dict[str, Any] = grid_columns(training)
    return from_flags(
        plot,
        config,
        model=model or JOB_DEFAULT_MODEL,
        gpu=gpu or GPU.default,
        models_dir=models_dir,
        optimizers_dir=optimizers_dir,
        overhead=overhead,
        overhead_file=overhead_file,
    )


def _echo_report(report: dict[str, Any], *, x: str, y: str, as_json: bool) -> None:
    """Print the report: JSON, or a line on what was written and a line on what fits along x
    (the largest value for a numeric axis, every fitting value for a categorical one)."""
    from trainmem.sweep._heatmap import BOOL_AXES, CATEGORICAL

    if as_json:
        typer.echo(json_text(report))
        return
    cells = report["cells"]
    typer.echo(
        f"wrote {report['out']}: {report['model']} on {report['gpu']['name']}, "
        f"{len(cells)} cells, {sum(c['fits'] for c in cells)} fit "
        f"(limit {report['limit_bytes'] / GIB:.2f} GiB)"
    )
    answers = report["fitting_x_values"].items()
    if x not in CATEGORICAL and x not in BOOL_AXES:
        text = ", ".join(f"{k}: {v[-1] if v else 'none'}" for k, v in answers)
        typer.echo(f"largest {x} that fits, by {y}: {text}")
    else:
        text = "; ".join(f"{k}: {', '.join(map(str, v)) or 'none'}" for k, v in answers)
        typer.echo(f"{x} that fits, by {y}: {text}")
    _echo_nothing_fits(report, cells)


def _echo_nothing_fits(report: dict[str, Any], cells: list[dict[str, Any]]) -> None:
    """No cell fits: the closest cell and what to change (estimate's advice for it); from
    stored points, where to look instead."""
    from trainmem.report import change_lines

    if any(c["fits"] for c in cells):
        return
    if "closest_cell" not in report:
        typer.echo(
            "nothing fits: widen --x-values/--y-values, or run `trainmem estimate` on a "
            "cell's settings for the changes that make it fit"
        )
        return
    cell, x, y = report["closest_cell"], report["x"], report["y"]
    typer.echo(
        f"nothing fits; the closest cell, {x} {cell[x]} x {y} {cell[y]}, needs "
        f"{cell['peak_device_bytes'] / GIB:.2f} GiB:"
    )
    if report["advice"]:
        typer.echo("\n".join(change_lines(report["advice"])))


def register(app: typer.Typer) -> None:
    """Add `heatmap` to the CLI app."""
    app.command("heatmap", epilog=EXIT_CODES)(heatmap_cmd)
