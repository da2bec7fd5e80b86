"""`trainmem trace`: one training step measured on fake tensors next to the estimate
(trainmem.trace, the trace extra), built only when named (cli/_app.py's LAZY_COMMANDS).
"""

from __future__ import annotations

from typing import Annotated

import typer

from trainmem.engine import ATTENTION
from trainmem.report import EXIT_CODES, command_fields, json_text

# The options, one alias each (the help text beside the type), so that the command's signature
# reads as the option list: names, order and defaults.
_Model = Annotated[str, typer.Option(help="Preset name or path to a HF config.json.")]
_Module = Annotated[
    str | None,
    typer.Option(
        help="Trace any nn.Module instead: pkg.mod:factory or path/file.py:factory "
        "(factory() -> (module, batch[, loss_fn]); see README)."
    ),
]
_SeqLen = Annotated[int, typer.Option(help="Sequence length (tokens).")]
_MicroBatchSize = Annotated[int, typer.Option(help="Sequences per step.")]
_Precision = Annotated[
    str, typer.Option(help="fp32 | bf16 | amp-bf16 (| mixed-bf16 with --zero 3)")
]
_Optimizer = Annotated[
    str, typer.Option(help="adamw | adamw-fused | adamw-loop | sgd | sgd-momentum")
]
_Recompute = Annotated[str, typer.Option(help="none|full")]
_Attention = Annotated[str, typer.Option(help=" | ".join(ATTENTION))]
_SdpaKernel = Annotated[
    str, typer.Option(help="SDPA kernel the GPU runs: flash|efficient|cudnn|math.")
]
_Device = Annotated[str, typer.Option(help="Fake device: cuda (CUDA kernels and autocast) or cpu.")]
_NumGpus = Annotated[int, typer.Option(help="Ranks of the job (one rank is traced).")]
_Zero = Annotated[int, typer.Option(help="3: FSDP2 fully_shard over num-gpus ranks.")]
_Tp = Annotated[
    int, typer.Option(help="Tensor parallel degree (HF tp_plan layout; --num-gpus = tp).")
]
_SequenceParallel = Annotated[
    bool,
    typer.Option(
        "--sequence-parallel", help="With --tp: norms and residuals split over the sequence."
    ),
]
_Gpu = Annotated[str, typer.Option(help="GPU profile of the estimate it is compared with.")]
_SaveProfile = Annotated[
    str | None,
    typer.Option(help="Trace two lengths and write an activation profile JSON here."),
]
_ProfileSeqLens = Annotated[
    str | None, typer.Option(help="The two lengths A,B (default: seq-len, 2 x seq-len).")
]
_ProfileName = Annotated[str | None, typer.Option(help="The profile's name.")]
_RealGpu = Annotated[
    bool,
    typer.Option("--real-gpu", help="Also run the step on this machine's CUDA device."),
]
_LoraRank = Annotated[int, typer.Option(help="peft LoRA rank (0: full fine-tuning; needs peft).")]
_LoraTargets = Annotated[
    str, typer.Option(help="LoRA target modules: all-linear or q_proj,v_proj,...")
]
_Qlora = Annotated[
    bool, typer.Option("--qlora", help="Refused: QLoRA needs bitsandbytes' CUDA kernels.")
]
_Snapshot = Annotated[
    str | None,
    typer.Option(
        help="Also write the traced step here as a PyTorch memory snapshot pickle "
        "(memory_viz, `trainmem explain`)."
    ),
]
_Timeout = Annotated[
    str | None,
    typer.Option(
        "--timeout",
        metavar="SECONDS",
        help="Stop the trace, with every process the model started, after SECONDS (0.1 to "
        "604800; default $TRAINMEM_TRACE_TIMEOUT, else 1800).",
    ),
]
_MaxMemoryGb = Annotated[
    str | None,
    typer.Option(
        "--max-memory-gb",
        metavar="GB",
        help="Stop the trace when its processes hold more memory than GB (1 to 65536; default "
        "$TRAINMEM_TRACE_MAX_MEMORY_GB, else no cap).",
    ),
]
_Overhead = Annotated[
    list[str] | None,
    typer.Option(help="Override an overhead parameter of the estimate, KEY=BYTES (repeatable)."),
]
_OverheadFile = Annotated[
    str | None,
    typer.Option(
        help="TOML file of overhead values for the estimate, the --overhead keys (what "
        "`trainmem explain --calibrate` writes); --overhead items given too win."
    ),
]
_ImagesPerSample = Annotated[
    int,
    typer.Option(
        help="A vision-language --model's images per sequence (0: text only); its step runs on "
        "real CPU tensors (the models read their image inputs' values)."
    ),
]
_ImageSize = Annotated[int, typer.Option(help="Side of a (square) image in pixels.")]
_FreezeVision = Annotated[
    bool,
    typer.Option("--freeze-vision", help="Freeze the vision tower and projector."),
]
_LoraScope = Annotated[
    str,
    typer.Option(
        help="A vision-language model's LoRA: auto (peft's matching: all-linear adapts the "
        "vision tower and projector too) or language (the language model's linears only)."
    ),
]
_AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


def trace_cmd(
    model: _Model = "llama-3.2-1b",
    module: _Module = None,
    seq_len: _SeqLen = 2048,
    micro_batch_size: _MicroBatchSize = 1,
    precision: _Precision = "bf16",
    optimizer: _Optimizer = "adamw",
    recompute: _Recompute = "none",
    attention: _Attention = "flash",
    sdpa_kernel: _SdpaKernel = "flash",
    device: _Device = "cuda",
    num_gpus: _NumGpus = 1,
    zero: _Zero = 0,
    tp: _Tp = 1,
    sequence_parallel: _SequenceParallel = False,
    gpu: _Gpu = "h100-sxm-80gb",
    save_profile: _SaveProfile = None,
    profile_seq_lens: _ProfileSeqLens = None,
    profile_name: _ProfileName = None,
    real_gpu: _RealGpu = False,
    lora_rank: _LoraRank = 0,
    lora_targets: _LoraTargets = "all-linear",
    qlora: _Qlora = False,
    snapshot: _Snapshot = None,
    images_per_sample: _ImagesPerSample = 0,
    image_size: _ImageSize = 448,
    freeze_vision: _FreezeVision = False,
    lora_scope: _LoraScope = "auto",
    timeout: _Timeout = None,
    max_memory_gb: _MaxMemoryGb = None,
    overhead: _Overhead = None,
    overhead_file: _OverheadFile = None,
    as_json: _AsJson = False,
) -> None:
    """Measure one training step on fake tensors next to the estimate (needs the trace extra).

    The trace always runs in one bounded child process (trace/_child.py): --timeout and
    --max-memory-gb end it with every process the model started, in one error line.
    --overhead and --overhead-file change the estimate beside the trace, not the trace."""
    fields = command_fields(locals())
    from trainmem.report import PICTURE_OPTIONS, command_defaults, overhead_overrides
    from trainmem.trace._bounds import resolve_bounds
    from trainmem.trace._report import bounded_trace_report, trace_text

    from ._app import estimate_cmd
    from ._progress import spinner

    bounds = resolve_bounds(fields.pop("timeout"), fields.pop("max_memory_gb"))
    # estimate's defaults for the report beside the trace: its training and output fields, not
    # the files its --plot / --memory-viz would write.
    pictures = {option.name for option in PICTURE_OPTIONS}
    defaults = {k: v for k, v in command_defaults(estimate_cmd).items() if k not in pictures}
    overheads = {"overhead": fields.pop("overhead"), "overhead_file": fields.pop("overhead_file")}
    overhead_overrides(**overheads)  # a bad file or item: one line before the child starts
    defaults.update(overheads)  # the estimate's (in the child), the GPU's bytes checked there
    what = fields["module"] or fields["model"]
    with spinner(f"tracing {what} on fake tensors", as_json=as_json):
        report = bounded_trace_report({**fields, "estimate_defaults": defaults}, bounds)
    typer.echo(json_text(report) if as_json else trace_text(report))


def register(app: typer.Typer) -> None:
    """Add `trace` to the CLI app."""
    app.command("trace", epilog=EXIT_CODES)(trace_cmd)
