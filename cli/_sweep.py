"""The `sweep` and `points` commands, registered on the CLI's typer app by `register`.

Bad input raises ValueError (one line); the CLI's main() prints it and exits with code 2.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

import typer

from trainmem.hardware import GIB
from trainmem.report import EXIT_CODES, json_text
from trainmem.sweep import SWEEP_OPTIONS
from trainmem.sweep._axes import SHOW, heading, shown_columns

from ._options import command
from ._progress import progress_bar

if TYPE_CHECKING:
    from trainmem.sweep import SearchResult

# ---- sweep -------------------------------------------------------------------------------------


def _top_table(result: SearchResult, *, rl: bool) -> str:
    cols = shown_columns(tuple(c for c in SHOW if c != "dp"), rl=rl)
    heads = tuple(heading(c) for c in cols)
    lines = [
        " ".join(f"{h:>9}" if i else f"{h:<16}" for i, h in enumerate(heads))
        + f"{'GiB':>8}{'step s':>9}{'$/Mtok':>9}"
    ]
    for row in result.top.iter_rows(named=True):
        cells = " ".join(f"{row[c]!s:>9}" if i else f"{row[c]!s:<16}" for i, c in enumerate(cols))
        lines.append(
            f"{cells}{row['peak_device_bytes'] / GIB:>8.2f}{row['step_time_s']:>9.3g}"
            f"{row['cost_per_million_tokens']:>9.4g}"
        )
    return "\n".join(lines)


@command(SWEEP_OPTIONS)
def sweep_cmd(training: dict[str, Any], *, as_json: bool, **options: Any) -> None:
    """Search a fleet for the cheapest (or fastest, or smallest) configuration that fits."""
    from trainmem.sweep._fleet_use import fleet_use_text
    from trainmem.sweep._run import sweep_report  # the searches (polars, Optuna): run time only
    from trainmem.sweep._why import why_lines

    method = options["method"]
    unit = "points" if method == "exhaustive" else "trials"
    with progress_bar(f"{method}: {unit}", as_json=as_json) as progress:
        report = sweep_report(training, progress=progress, **options)
    for warning in report.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    if as_json:
        typer.echo(json_text(report))
        return
    result, space, objectives = report.result, report.space, report.objectives
    typer.echo(
        f"{method}: {result.num_points:,} points of {space.model.name} on {options['fleet']} "
        f"({_job_text(space)}) in {result.elapsed_s:.2f} s -> {result.parquet}"
        f"{_stored_text(result)}"
    )
    if not result.best:
        typer.echo(_nothing_fits(result, space) + _constraints_hint(options))
        return
    if report["used_gpus"] is not None:
        typer.echo(f"best {fleet_use_text(report)}")
    if space.risk is not None:
        typer.echo(_risk_text(report, space))
    typer.echo(_top_table(result, rl=_is_rl(space)))
    if len(objectives) > 1:
        typer.echo(f"Pareto front ({' vs '.join(objectives)}): {len(result.best)} points")
    if report.why is not None:
        typer.echo("\n".join(why_lines(report.why)))


def _risk_text(report: Mapping[str, Any], space: Any) -> str:
    """`--lengths`: what fits means, and the best point's steps over the dataset."""
    risk = space.risk
    line = (
        f"over {risk.source} ({int(risk.counts.sum()):,} sequences, {risk.batching}): a point "
        f"fits when the OOM probability of an epoch is <= {risk.risk:g} (GiB below: the peak "
        f"at seq {space.fixed['seq_len']})"
    )
    best = report.get("best")
    if best and best.get("oom_probability") is not None:
        q = best["step_peak_quantiles"]
        line += (
            f"; best: worst step {q['max'] / GIB:.2f} GiB, p50 {q['p50'] / GIB:.2f}, "
            f"p99 {q['p99'] / GIB:.2f}"
        )
    return line


def _job_text(space: Any) -> str:
    """``megatron, mixed-bf16, seq 4096, global batch 256``: the job's fixed fields."""
    f = space.fixed
    return (
        f"{f['framework']}, {f['precision']}, seq {f['seq_len']}, "
        f"global batch {f['global_batch_size']}"
    )


def _is_rl(space: Any) -> bool:
    """The space's job is an RL one (--rl): its tables show the RL axes."""
    return str(space.fixed.get("rl", "none")) != "none"


def _nothing_fits(result: SearchResult, space: Any) -> str:
    """``nothing fits`` and, when a valid point exists, the one nearest to fitting and how far
    over its GPU's limit (usable memory x (1 - headroom); the points hold no headroom column)."""
    near = result.extra.get("closest")
    if not near:
        return "nothing fits (no valid layout: see the reasons with `trainmem points`)"
    shown = shown_columns(SHOW, rl=_is_rl(space))
    layout = " ".join(f"{k} {near[k]}" for k in shown if k not in ("gpu", "num_gpus"))
    limit_bytes = space.gpus[near["gpu"]].usable_bytes * (1 - space.headroom)
    over = (near["peak_device_bytes"] - limit_bytes) / GIB
    return (
        f"nothing fits; closest: {near['num_gpus']} x {near['gpu']}, {layout}: peak "
        f"{near['peak_device_bytes'] / GIB:.2f} GiB, {over:.2f} GiB over the limit (what to "
        "change: `trainmem estimate` of it lists the changes that make it fit)"
    )


CONSTRAINT_FLAGS = {
    "max_step_time_s": "--max-step-time",
    "max_cost_per_million_tokens": "--max-cost-per-million-tokens",
    "use_all_gpus": "--use-all-gpus",
}
"""The search options that rule points out (each a reason of its own in `trainmem points`)."""


def _constraints_hint(options: dict[str, Any]) -> str:
    """When nothing fits under constraints the user set: ``; loosen --max-step-time ...``."""
    given = [flag for name, flag in CONSTRAINT_FLAGS.items() if options.get(name)]
    if options.get("min_gpus", 1) > 1:
        given.append("--min-gpus")
    return f"; loosen {', '.join(given)}, which rule points out" if given else ""


def _stored_text(result: SearchResult) -> str:
    """`` (stored: N fits points)`` when the parts keep only some of the points (--store)."""
    store = result.extra.get("store", "all")
    if store == "all":
        return ""
    return f" (stored: {result.extra['num_points_stored']:,} points, --store {store})"


# ---- points ------------------------------------------------------------------------------------


def points_cmd(
    path: Annotated[str, typer.Argument(help="Output folder of a sweep (or one study's).")] = "out",
    where: Annotated[
        str | None, typer.Option(help='SQL WHERE clause, e.g. "fits AND num_gpus <= 8".')
    ] = None,
    sort: Annotated[str | None, typer.Option(help="Sort by this column (ascending).")] = None,
    descending: Annotated[bool, typer.Option("--descending", help="Sort descending.")] = False,
    head: Annotated[int, typer.Option(help="At most this many rows.")] = 10,
    columns: Annotated[
        str | None, typer.Option(help="Comma-separated columns to show (default: a summary).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list of rows.")] = False,
) -> None:
    """Query stored points (polars): filter, sort, limit."""
    import polars as pl

    from trainmem.results import query_points

    frame = query_points(path, where=where, sort=sort, descending=descending, head=head)
    if columns:
        wanted = [c.strip() for c in columns.split(",") if c.strip()]
        unknown = [c for c in wanted if c not in frame.columns]
        if unknown:
            raise ValueError(f"--columns: unknown column {unknown[0]!r}")
        frame = frame.select(wanted)
    elif not as_json:
        rl = "rl" in frame.columns and bool((frame["rl"].cast(pl.String) != "none").any())
        frame = frame.select(
            [
                *shown_columns(SHOW, rl=rl),
                *("peak_device_bytes", "fits", "step_time_s", "cost_per_million_tokens"),
            ]
        )
    if as_json:  # byte counts are whole bytes (Int64; rounded from schema 3's Float64)
        typer.echo(json_text(frame.to_dicts()))
        return
    byte_columns = [name for name in frame.columns if name.endswith("_bytes")]
    frame = frame.select(
        (pl.col(name) / GIB).round(2).alias(name.removesuffix("_bytes") + "_gib")
        if name in byte_columns
        else pl.col(name)
        for name in frame.columns
    )
    with pl.Config(tbl_rows=max(head, 1), tbl_cols=-1, tbl_width_chars=200):
        typer.echo(str(frame))


def register(app: typer.Typer) -> None:
    """Add `sweep` and `points` to the CLI app."""
    app.command("sweep", epilog=EXIT_CODES)(sweep_cmd)
    app.command("points", epilog=EXIT_CODES)(points_cmd)
