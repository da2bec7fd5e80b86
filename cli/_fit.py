"""`trainmem fit`: the largest micro-batch (or fewest GPUs) that fits (trainmem.sweep).

Bad input raises ValueError (one line); the CLI's main() prints it and exits with code 2.
"""

from __future__ import annotations

from typing import Any

import typer

from trainmem.hardware import GIB
from trainmem.report import EXIT_CODES, change_lines, json_text
from trainmem.sweep import FIT_OPTIONS, fit_report

from ._options import command


@command(FIT_OPTIONS)
def fit_cmd(training: dict[str, Any], *, as_json: bool, check: bool, **options: Any) -> None:
    """The largest micro-batch that fits (or, --minimize num-gpus, the fewest GPUs)."""
    result = fit_report(training, **options)
    for warning in result.get("warnings", []):
        typer.echo(f"warning: {warning}", err=True)
    key = "min_num_gpus" if options["minimize"] == "num-gpus" else "max_micro_batch_size"
    _print_fit(result, options["minimize"], training["seq_len"], as_json=as_json)
    if check and result[key] is None:
        raise typer.Exit(1)


def _print_fit(result: dict[str, Any], minimize: str, seq_len: int, *, as_json: bool) -> None:
    if as_json:
        typer.echo(json_text(result))
        return
    report = result["estimate"]
    by_gpus = minimize == "num-gpus"
    answer = result["min_num_gpus" if by_gpus else "max_micro_batch_size"]
    if answer is None:
        typer.echo(f"nothing fits on {report['gpu']['name']}{_shortfall_text(result, by_gpus)}")
        if result.get("advice"):  # what to change, as estimate says it
            typer.echo("\n".join(change_lines(result["advice"])))
        return
    what = "smallest GPU count" if by_gpus else "largest micro-batch size"
    risk = result.get("risk")
    if risk is not None:  # --lengths: the epoch over the dataset decides, not seq_len
        typer.echo(
            f"largest micro-batch size within risk {risk['risk']:g} over {risk['source']} "
            f"({risk['num_sequences']:,} sequences, {risk['batching']}): {answer} "
            f"({report['model']} on {report['config']['num_gpus']} x {report['gpu']['name']}, "
            f"seq {seq_len}): worst step {risk['worst_step_peak_device_bytes'] / GIB:.2f} GiB, "
            f"p50 {risk['step_peak_quantiles']['p50'] / GIB:.2f} GiB, OOM probability of an "
            f"epoch {risk['oom_probability']:g}"
        )
        return
    typer.echo(
        f"{what} that fits: {answer} ({report['model']} on {report['config']['num_gpus']} x "
        f"{report['gpu']['name']}, seq {seq_len}): peak "
        f"{report['peak_device_bytes'] / GIB:.2f} GiB"
    )


def _shortfall_text(result: dict[str, Any], by_gpus: bool) -> str:
    """``: micro-batch 1 needs 95.31 GiB, 24.04 GiB over the 71.27 GiB limit (...)`` for the
    closest candidate, or `` (reason)`` when no candidate is a valid configuration."""
    if "shortfall_bytes" not in result:
        return f" ({result['reason']})"
    report = result["estimate"]
    peak = result["closest_peak_device_bytes"]
    shortfall = result["shortfall_bytes"]
    num_gpus = report["config"]["num_gpus"]
    if by_gpus:
        who = f"{num_gpus} GPU needs" if num_gpus == 1 else f"{num_gpus} GPUs need"
    else:
        who = f"micro-batch {report['config']['micro_batch_size']} needs"
    return (
        f": {who} {peak / GIB:.2f} GiB, {shortfall / GIB:.2f} GiB over the "
        f"{(peak - shortfall) / GIB:.2f} GiB limit ({report['gpu']['usable_bytes'] / GIB:.2f} "
        f"usable, {report['headroom']:.0%} headroom)"
    )


def register(app: typer.Typer) -> None:
    """Add `fit` to the CLI app."""
    app.command("fit", epilog=EXIT_CODES)(fit_cmd)
