"""`trainmem heatmap`: two knobs on the axes, colour = peak device memory (trainmem.sweep)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from trainmem.hardware import GIB
from trainmem.report import check_headroom
from trainmem.results import heatmap_format
from trainmem.sweep._heatmap import BOOL_AXES, CATEGORICAL, Plot, from_flags, from_points

from ._options import (
    ActivationOffload,
    AsJson,
    Attention,
    Cp,
    Ep,
    Framework,
    GlobalBatchSize,
    HardwareDir,
    Headroom,
    LoraRank,
    LoraTargets,
    Loss,
    MicroBatchSize,
    ModelsDir,
    NumGpus,
    Offload,
    Optimizer,
    OptimizersDir,
    Pp,
    Precision,
    Qlora,
    Recompute,
    SeqLen,
    SequenceParallel,
    Tp,
    VirtualStages,
    Zero,
)


def heatmap_cmd(
    model: Annotated[
        str | None, typer.Option(help="Preset name or HF config.json path; default llama-3.1-8b.")
    ] = None,
    gpu: Annotated[
        str | None, typer.Option(help="GPU profile (`trainmem gpus`); default h100-sxm-80gb.")
    ] = None,
    x: Annotated[str, typer.Option("--x", help="Field on the x axis (listed above).")] = (
        "micro_batch_size"
    ),
    y: Annotated[str, typer.Option("--y", help="Field on the y axis.")] = "seq_len",
    x_values: Annotated[
        str | None, typer.Option(help="Comma list of x values (default: a range per field).")
    ] = None,
    y_values: Annotated[str | None, typer.Option(help="Comma list of y values.")] = None,
    out: Annotated[str, typer.Option(help="Image file: .png or .svg.")] = "heatmap.png",
    points: Annotated[
        str | None,
        typer.Option(help="Draw stored points (a sweep's --out folder): best point per cell."),
    ] = None,
    where: Annotated[
        str | None, typer.Option(help='With --points: SQL WHERE clause, e.g. "zero = 3".')
    ] = None,
    num_gpus: NumGpus = 1,
    seq_len: SeqLen = 2048,
    micro_batch_size: MicroBatchSize = 1,
    global_batch_size: GlobalBatchSize = 0,
    precision: Precision = "amp-bf16",
    optimizer: Optimizer = "adamw",
    recompute: Recompute = "none",
    attention: Attention = "flash",
    zero: Zero = 0,
    tp: Tp = 1,
    pp: Pp = 1,
    virtual_stages: VirtualStages = 1,
    cp: Cp = 1,
    sequence_parallel: SequenceParallel = False,
    framework: Framework = "hf",
    ep: Ep = 1,
    offload: Offload = "none",
    lora_rank: LoraRank = 0,
    lora_targets: LoraTargets = "all-linear",
    qlora: Qlora = False,
    loss: Loss = "full",
    activation_offload: ActivationOffload = False,
    headroom: Headroom = 0.10,
    hardware_dir: HardwareDir = (None),
    models_dir: ModelsDir = None,
    optimizers_dir: OptimizersDir = None,
    as_json: AsJson = False,
) -> None:
    """Fit/no-fit heatmap of two knobs: peak device memory per GPU and the fit boundary.

    Colour = peak device memory per GPU (GiB), a line at the GPU's usable memory less the
    headroom. Axes: micro_batch_size, seq_len, num_gpus, tp, pp,
    cp, ep, virtual_stages, zero, lora_rank, recompute, offload, precision, optimizer,
    attention, framework, loss, sequence_parallel, activation_offload, qlora (--points: also
    dp, grad_accum_steps, global_batch_size). With --points the other settings come from the
    points and each cell shows its best point (smallest peak that fits, else smallest peak);
    the configuration flags are then ignored. PNG, or SVG by extension.
    """
    fmt = heatmap_format(out)
    plot = Plot(x=x, y=y, x_text=x_values, y_text=y_values, out=out,
                headroom=check_headroom(headroom), hardware_dir=hardware_dir)  # fmt: skip
    if points is not None:
        if model is not None or gpu is not None:
            raise ValueError("--model/--gpu: with --points they come from the points; "
                             "select them with --where \"gpu = 'NAME'\"")  # fmt: skip
        report = from_points(plot, points, where=where)
    else:
        if where is not None:
            raise ValueError("--where: applies to --points only")
        config: dict[str, Any] = {
            "micro_batch_size": micro_batch_size, "seq_len": seq_len, "num_gpus": num_gpus,
            "global_batch_size": global_batch_size, "tp": tp, "pp": pp, "cp": cp,
            "virtual_stages": virtual_stages, "zero": zero,
            "sequence_parallel": sequence_parallel, "precision": precision,
            "optimizer": optimizer, "recompute": recompute, "attention": attention,
            "framework": framework, "ep": ep, "offload": offload, "lora_rank": lora_rank,
            "lora_targets": lora_targets, "qlora": qlora, "loss": loss,
            "activation_offload": activation_offload,
        }  # fmt: skip
        report = from_flags(plot, config, model=model or "llama-3.1-8b",
                             gpu=gpu or "h100-sxm-80gb", models_dir=models_dir,
                             optimizers_dir=optimizers_dir)  # fmt: skip
    report["format"] = fmt
    if as_json:
        typer.echo(json.dumps(report, indent=2))
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


def register(app: typer.Typer) -> None:
    """Add `heatmap` to the CLI app."""
    app.command("heatmap")(heatmap_cmd)
