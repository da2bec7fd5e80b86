"""`trainmem trace --lora-rank R`: the traced step with peft LoRA adapters on a frozen base.

The Hugging Face model is built as for a full fine-tune (trace/_core.py hf_job), its weights
cast to bf16 for `--precision bf16`, then wrapped by peft's get_peft_model with
LoraConfig(r=R, lora_alpha=2R, lora_dropout=0.0, target_modules=the targets, task_type
CAUSAL_LM): the base weights frozen, one lora_A [r, d_in] and lora_B [d_out, r] per adapted
linear, trainable. peft's default autocast_adapter_dtype=True keeps the adapters fp32 whatever
the base dtype (the engine's `hf` framework: ADAPTERS_IN_PARAM_DTYPE False, LORA_ADAPTER_BYTES
4), so the step's later bf16 cast is skipped (StepJob.dtypes_set). lora_dropout 0 is peft's
default and the engine's assumption (a nonzero one would save a dropout mask per adapted input).
`all-linear` is peft's own shorthand (every linear but the output head).

QLoRA is refused: its NF4 base needs bitsandbytes' CUDA kernels, which the fake device cannot
run. Under FSDP2 the adapters are wrapped before fully_shard (as accelerate does); tensor
parallelism with LoRA is refused.

Source: peft/tuners/lora/config.py (LoraConfig defaults: lora_dropout 0.0), peft/mapping_func.py
get_peft_model (autocast_adapter_dtype=True), peft/tuners/tuners_utils.py cast_adapter_dtype
(bf16/fp16 adapters upcast to fp32), peft/tuners/lora/layer.py (Linear.forward: the input cast
to lora_A's dtype), peft 0.21.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

LORA_ALPHA_PER_RANK = 2
"""lora_alpha = 2 r (a common recipe; alpha only scales the adapter's output, no memory)."""
LORA_DROPOUT = 0.0
"""peft's default and the engine's assumption (engine/_lora.py lora_activation_delta_bytes)."""
QLORA_REFUSAL = (
    "qlora: the trace cannot run QLoRA (its NF4 base needs bitsandbytes' CUDA kernels, which "
    "the fake device lacks); trace --lora-rank without --qlora, or estimate QLoRA"
)


def check_lora(*, lora_rank: int, lora_targets: str, qlora: bool, tp: int = 1) -> None:
    """One-line ValueErrors for the LoRA flags the trace does not run."""
    if qlora:
        raise ValueError(QLORA_REFUSAL)
    if lora_rank < 0:
        raise ValueError(f"lora-rank: must be >= 0; got {lora_rank}")
    if lora_rank and not target_modules(lora_targets):
        raise ValueError("lora-targets: name at least one module (or all-linear)")
    if lora_rank and tp > 1:
        raise ValueError("lora-rank: the trace runs LoRA on one GPU or FSDP2, not with --tp")


def import_peft() -> Any:
    """peft, or a one-line ValueError saying how to install it."""
    try:
        import peft
    except ImportError:
        raise ValueError(
            "lora-rank: the LoRA trace needs peft; install it with: pip install 'trainmem[trace]'"
        ) from None
    return peft


def target_modules(lora_targets: str) -> str | list[str]:
    """peft's target_modules for the flag: "all-linear" as is, else the listed module names."""
    names = [n.strip() for n in lora_targets.split(",") if n.strip()]
    return "all-linear" if names == ["all-linear"] else names


@contextlib.contextmanager
def in_place_module_to() -> Iterator[None]:
    """nn.Module.to moves and casts each parameter and buffer in place (`.data`) for the
    duration: peft moves each new adapter to its base layer's device and dtype, then upcasts it
    to fp32, with Module.to, which swaps fake tensors and refuses weakly referenced ones (as
    trace/_step.py cast_floating works around)."""
    import torch

    plain = torch.nn.Module.to

    def to(module: Any, *args: Any, **kwargs: Any) -> Any:
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        for t in [*module.parameters(), *module.buffers()]:
            keep = dtype is None or not (t.is_floating_point() or t.is_complex())
            t.data = t.data.to(device=device or t.device, dtype=t.dtype if keep else dtype)
        return module

    torch.nn.Module.to = to  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.nn.Module.to = plain  # type: ignore[method-assign]


def with_lora(
    build: Callable[[], Any], *, lora_rank: int, lora_targets: str, precision: str
) -> Callable[[], Any]:
    """A builder of `build`'s step with the model wrapped by peft LoRA (see the module
    docstring); the adapters fp32, the base in the precision's dtype."""
    peft = import_peft()

    def lora_build() -> Any:
        import torch

        from ._step import cast_floating

        job = build()
        if precision == "bf16":
            cast_floating(job.model, torch.bfloat16)  # the base, as the plain step would
        config = peft.LoraConfig(
            r=lora_rank,
            lora_alpha=LORA_ALPHA_PER_RANK * lora_rank,
            lora_dropout=LORA_DROPOUT,
            target_modules=target_modules(lora_targets),
            task_type="CAUSAL_LM",
        )
        with in_place_module_to():
            job.model = peft.get_peft_model(job.model, config)
        job.dtypes_set = True
        return job

    return lora_build
