"""`trainmem recommend`: the best plan for a job on a fleet (trainmem.plan), printed."""

from __future__ import annotations

import sys
from typing import Any

import typer

from trainmem.plan import (
    RECOMMEND_OPTIONS,
    format_framework,
    render,
    replan_line,
    replan_note,
    replans,
)
from trainmem.report import EXIT_CODES, json_text

from ._options import command
from ._progress import spinner


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
    an accelerate FSDP config, a torchtitan launch line, or for an RL job a verl recipe or a TRL
    GRPO / DPO config. When nothing fits, the JSON and the summary describe the closest
    configuration and the launch formats print nothing (a one-line note on stderr).
    Exit code 0: it ran (with --check: a plan fits); 1: --check and nothing fits; 2: bad input.
    """
    from trainmem.plan import recommend_report, summary  # the search (polars): run time only

    launched = None if fmt in (None, "json") else fmt
    fields = {**options, **training}
    fields["framework"] = format_framework(launched, training["framework"], training.get("rl"))
    with spinner(f"recommend: searching {options['fleet']}", as_json=as_json or fmt == "json"):
        report = recommend_report(**fields)
        if launched is not None and replans(launched, training["framework"]):
            before = recommend_report(**{**fields, "framework": training["framework"]})
            report["replanned_for_format"] = replan_note(before, report, launched)
    for warning in report.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    if "replanned_for_format" in report:
        typer.echo(replan_line(report["replanned_for_format"]), err=True)
    if as_json or fmt == "json":
        typer.echo(json_text(report))
    elif launched is not None and not report["fits"]:
        typer.echo(report["reason"], err=True)
    else:
        text = summary(report) if launched is None else render(report, launched)
        typer.echo(text.rstrip("\n"))
    if check and not report["fits"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `recommend` to the CLI app."""
    app.command("recommend", epilog=EXIT_CODES)(recommend_cmd)
