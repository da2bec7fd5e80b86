"""`trainmem recommend`: the best plan for a job on a fleet (trainmem.plan), printed."""

from __future__ import annotations

from typing import Annotated

import typer

from trainmem.engine import FRAMEWORKS
from trainmem.plan import (
    DEFAULT_FRAMEWORK,
    FORMATS,
    REPORT_FIELDS,
    check_format,
    recommend_report,
    render,
    summary,
)
from trainmem.report import choice

from ._options import (
    AsJson,
    GlobalBatchSize,
    HardwareDir,
    Headroom,
    Model,
    ModelsDir,
    Optimizer,
    OptimizersDir,
    Precision,
    SeqLen,
)


def recommend_cmd(
    model: Model = ("llama-3.1-8b"),
    fleet: Annotated[
        str, typer.Option(help="COUNTxGPU[,COUNTxGPU...] or a fleet TOML file.")
    ] = "8xh100-sxm-80gb",
    seq_len: SeqLen = 4096,
    global_batch_size: GlobalBatchSize = 256,
    fmt: Annotated[
        str | None, typer.Option("--format", help="|".join(FORMATS) + " (default: a summary).")
    ] = None,
    as_json: AsJson = False,
    precision: Precision = "mixed-bf16",
    optimizer: Optimizer = ("adamw"),
    framework: Annotated[
        str | None,
        typer.Option(help="|".join(FRAMEWORKS) + " (default: the format's; megatron)."),
    ] = None,
    objective: Annotated[str, typer.Option(help="cost|time|gpus")] = "cost",
    num_alternatives: Annotated[int, typer.Option(help="Runners-up (distinct layouts).")] = 4,
    max_micro_batch_size: Annotated[int, typer.Option(help="Largest micro-batch tried.")] = 16,
    max_pp: Annotated[int, typer.Option(help="Largest pipeline degree tried.")] = 16,
    max_cp: Annotated[int, typer.Option(help="Largest context-parallel degree tried.")] = 4,
    headroom: Headroom = 0.10,
    script: Annotated[
        str | None,
        typer.Option(help="Training script of torchrun/slurm (pretrain_gpt.py, train.py)."),
    ] = None,
    job_name: Annotated[str, typer.Option(help="slurm --job-name, torchrun --rdzv-id.")] = (
        "trainmem"
    ),
    time_limit: Annotated[str, typer.Option(help="slurm --time.")] = "24:00:00",
    hardware_dir: HardwareDir = (None),
    models_dir: ModelsDir = None,
    optimizers_dir: OptimizersDir = None,
) -> None:
    """The cheapest plan that fits a fleet, its runners-up, and its launch config.

    Searches the sweep's space (restricted to what the framework launches: deepspeed and hf/FSDP
    are data parallel only) and prints a summary, or --format json (the plan's gpu, num_gpus,
    num_nodes, gpus_per_node, tp, pp, dp, cp, ep, zero, recompute, micro_batch_size,
    grad_accum_steps, peak_device_bytes, headroom_bytes, step_time_s, cost_per_million_tokens,
    estimate_command and alternatives), a DeepSpeed config, a torchrun line, an sbatch script
    or an accelerate FSDP config. Exit code 0: a plan fits; 1: nothing fits (the JSON and the
    summary describe the closest configuration, the launch formats print nothing); 2: bad input.
    """
    fields = {k: v for k, v in locals().items() if k in REPORT_FIELDS}  # the parameters only
    shown = "json" if as_json else fmt
    if shown is not None:
        choice("format", shown, FORMATS)
        check_format(shown, framework or DEFAULT_FRAMEWORK[shown])
    if shown is not None and framework is None:
        fields["framework"] = DEFAULT_FRAMEWORK[shown]
    report = recommend_report(**fields)
    if shown not in (None, "json") and not report["fits"]:
        typer.echo(f"error: {report['reason']}", err=True)
        raise typer.Exit(1)
    text = summary(report) if shown is None else render(report, shown)
    typer.echo(text.rstrip("\n"))
    if not report["fits"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `recommend` to the CLI app."""
    app.command("recommend")(recommend_cmd)
