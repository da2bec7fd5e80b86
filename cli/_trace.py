"""`trainmem trace`: one training step measured on fake tensors next to the estimate
(trainmem.trace, the trace extra), built only when named (cli/_app.py's LAZY_COMMANDS).
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from trainmem.engine import ATTENTION
from trainmem.report import EXIT_CODES, command_fields


def trace_cmd(
    model: Annotated[str, typer.Option(help="Preset name or path to a HF config.json.")] = (
        "llama-3.2-1b"
    ),
    module: Annotated[
        str | None,
        typer.Option(
            help="Trace any nn.Module instead: pkg.mod:factory or path/file.py:factory "
            "(factory() -> (module, batch[, loss_fn]); see README)."
        ),
    ] = None,
    seq_len: Annotated[int, typer.Option(help="Sequence length (tokens).")] = 2048,
    micro_batch_size: Annotated[int, typer.Option(help="Sequences per step.")] = 1,
    precision: Annotated[
        str, typer.Option(help="fp32 | bf16 | amp-bf16 (| mixed-bf16 with --zero 3)")
    ] = "bf16",
    optimizer: Annotated[
        str, typer.Option(help="adamw | adamw-fused | sgd | sgd-momentum")
    ] = "adamw",
    recompute: Annotated[str, typer.Option(help="none|full")] = "none",
    attention: Annotated[str, typer.Option(help=" | ".join(ATTENTION))] = "flash",
    sdpa_kernel: Annotated[
        str, typer.Option(help="SDPA kernel the GPU runs: flash|efficient|cudnn|math.")
    ] = "flash",
    device: Annotated[
        str, typer.Option(help="Fake device: cuda (CUDA kernels and autocast) or cpu.")
    ] = "cuda",
    num_gpus: Annotated[int, typer.Option(help="Ranks of the job (one rank is traced).")] = 1,
    zero: Annotated[int, typer.Option(help="3: FSDP2 fully_shard over num-gpus ranks.")] = 0,
    tp: Annotated[
        int, typer.Option(help="Tensor parallel degree (HF tp_plan layout; --num-gpus = tp).")
    ] = 1,
    sequence_parallel: Annotated[
        bool,
        typer.Option(
            "--sequence-parallel", help="With --tp: norms and residuals split over the sequence."
        ),
    ] = False,
    gpu: Annotated[str, typer.Option(help="GPU profile of the estimate it is compared with.")] = (
        "h100-sxm-80gb"
    ),
    save_profile: Annotated[
        str | None,
        typer.Option(help="Trace two lengths and write an activation profile JSON here."),
    ] = None,
    profile_seq_lens: Annotated[
        str | None, typer.Option(help="The two lengths A,B (default: seq-len, 2 x seq-len).")
    ] = None,
    profile_name: Annotated[str | None, typer.Option(help="The profile's name.")] = None,
    real_gpu: Annotated[
        bool,
        typer.Option("--real-gpu", help="Also run the step on this machine's CUDA device."),
    ] = False,
    lora_rank: Annotated[
        int, typer.Option(help="peft LoRA rank (0: full fine-tuning; needs peft).")
    ] = 0,
    lora_targets: Annotated[
        str, typer.Option(help="LoRA target modules: all-linear or q_proj,v_proj,...")
    ] = "all-linear",
    qlora: Annotated[
        bool, typer.Option("--qlora", help="Refused: QLoRA needs bitsandbytes' CUDA kernels.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Measure one training step on fake tensors next to the estimate (needs the trace extra)."""
    fields = command_fields(locals())
    from trainmem.report import command_defaults
    from trainmem.trace import trace_report, trace_text

    from ._app import estimate_cmd
    from ._progress import spinner

    try:
        what = fields["module"] or fields["model"]
        with spinner(f"tracing {what} on fake tensors", as_json=as_json):
            report = trace_report(**fields, estimate_defaults=command_defaults(estimate_cmd))
    except (RuntimeError, AssertionError, NotImplementedError, TypeError) as exc:
        # A model code path the fake device cannot run: one line, not torch's traceback.
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ValueError(
            f"trace: the step failed on fake tensors: {type(exc).__name__}: {first}"
        ) from None
    typer.echo(json.dumps(report, indent=2) if as_json else trace_text(report))


def register(app: typer.Typer) -> None:
    """Add `trace` to the CLI app."""
    app.command("trace", epilog=EXIT_CODES)(trace_cmd)
