"""`trainmem recommend`: the best plan for a job on a fleet (trainmem.plan), printed."""

from __future__ import annotations

import sys
from typing import Any

import typer

from trainmem.plan import RECOMMEND_OPTIONS, format_framework, render
from trainmem.report import EXIT_CODES

from ._options import command


@command(RECOMMEND_OPTIONS)
def recommend_cmd(
    training: dict[str, Any], *, fmt: str | None, as_json: bool, check: bool, **options: Any
) -> None:
    """The cheapest plan that fits a fleet, its runners-up, and its launch config.

    Searches the sweep's space (restricted to what the framework launches: deepspeed and hf/FSDP
    are data parallel only) and prints a summary, or --format json (the plan's gpu, num_gpus,
    num_nodes, gpus_per_node, tp, pp, dp, cp, ep, zero, recompute, micro_batch_size,
    grad_accum_steps, peak_device_bytes, headroom_bytes, step_time_s, cost_per_million_tokens,
    estimate_command and alternatives), a DeepSpeed config, a torchrun line, an sbatch script,
    an accelerate FSDP config or a torchtitan launch line. When nothing fits, the JSON and the
    summary describe the closest configuration and the launch formats print nothing (a one-line
    note on stderr).
    Exit code 0: it ran (with --check: a plan fits); 1: --check and nothing fits; 2: bad input.
    """
    from trainmem.plan import recommend_report, summary  # the search (polars): run time only

    shown = "json" if as_json else fmt
    fields = {**options, **training}
    fields["framework"] = format_framework(shown, training["framework"])
    report = recommend_report(**fields)
    for warning in report.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    if shown not in (None, "json") and not report["fits"]:
        typer.echo(report["reason"], err=True)
    else:
        text = summary(report) if shown is None else render(report, shown)
        typer.echo(text.rstrip("\n"))
    if check and not report["fits"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `recommend` to the CLI app."""
    app.command("recommend", epilog=EXIT_CODES)(recommend_cmd)
