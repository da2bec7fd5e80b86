"""The CLI options several commands share, declared once (typer `Annotated` aliases).

A command writes `seq_len: SeqLen = 2048`; its default stays in its own signature (commands
differ: sweep searches mixed-bf16 on Megatron, estimate defaults to amp-bf16 on HF). The HTTP
service (sweep/_serve.py) builds its request models from the same signatures.
"""

from __future__ import annotations

from typing import Annotated

import typer

from trainmem.engine import (
    ATTENTION,
    FRAMEWORKS,
    LOSSES,
    OFFLOADS,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
)

Model = Annotated[str, typer.Option(help="Preset name or path to a HF config.json.")]
Gpu = Annotated[str, typer.Option(help="GPU profile name (see `trainmem gpus`).")]
NumGpus = Annotated[int, typer.Option(help="Total GPUs; dp = num_gpus/(tp*pp*cp).")]
SeqLen = Annotated[int, typer.Option(help="Sequence length (tokens).")]
MicroBatchSize = Annotated[int, typer.Option(help="Sequences per GPU per step.")]
GlobalBatchSize = Annotated[int, typer.Option(help="Sequences per optimizer step (0: micro x dp).")]
Precision = Annotated[str, typer.Option(help="|".join(PRECISIONS))]
Optimizer = Annotated[str, typer.Option(help="|".join(OPTIMIZERS) + "|USER-NAME")]
Recompute = Annotated[str, typer.Option(help="|".join(RECOMPUTE))]
Attention = Annotated[str, typer.Option(help="|".join(ATTENTION))]
Zero = Annotated[int, typer.Option(help="ZeRO stage 0-3 (3 = FSDP full shard).")]
Tp = Annotated[int, typer.Option(help="Tensor parallel degree.")]
Pp = Annotated[int, typer.Option(help="Pipeline parallel degree.")]
VirtualStages = Annotated[int, typer.Option(help="Interleaved stages per rank.")]
Cp = Annotated[int, typer.Option(help="Context parallel degree.")]
SequenceParallel = Annotated[
    bool, typer.Option("--sequence-parallel", help="Megatron-style sequence parallelism.")
]
Framework = Annotated[str, typer.Option(help="|".join(FRAMEWORKS))]
Ep = Annotated[int, typer.Option(help="Expert parallel degree (MoE; divides dp*cp).")]
Offload = Annotated[str, typer.Option(help="|".join(OFFLOADS))]
LoraRank = Annotated[int, typer.Option(help="LoRA rank (0: full fine-tuning).")]
LoraTargets = Annotated[
    str, typer.Option(help="PEFT target modules, e.g. q_proj,v_proj, or all-linear.")
]
Qlora = Annotated[
    bool, typer.Option("--qlora", help="NF4 base weights (QLoRA); needs --lora-rank.")
]
Loss = Annotated[str, typer.Option(help="|".join(LOSSES))]
ActivationOffload = Annotated[
    bool, typer.Option("--activation-offload", help="Keep two blocks' activations on GPU.")
]
Headroom = Annotated[float, typer.Option(help="Fraction of usable memory kept free.")]
HardwareDir = Annotated[
    str | None, typer.Option(help="Folder of extra GPU TOML files (or TRAINMEM_HARDWARE_DIR).")
]
ModelsDir = Annotated[
    str | None,
    typer.Option(help="Folder of extra model presets, NAME.json (or TRAINMEM_MODELS_DIR)."),
]
OptimizersDir = Annotated[
    str | None,
    typer.Option(help="Folder of user optimizers, NAME.toml (or TRAINMEM_OPTIMIZERS_DIR)."),
]
ProfileFile = Annotated[
    str | None,
    typer.Option(
        "--profile", help="Activation profile JSON (`trainmem trace --save-profile`) as the model."
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
