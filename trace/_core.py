"""`trainmem trace`: measure one training step of a model on fake tensors.

Needs the optional extra `trainmem[trace]` (torch, transformers); the core install does not.
The step runs under torch's FakeTensorMode (real dispatcher, real autograd, real torch.optim and
checkpoint code, no data, no memory): a warm-up, then the measured step, exactly as the ground
truth was traced (loss = model(input_ids, labels=input_ids).loss; backward; optimizer.step();
zero_grad(set_to_none=True)), with the model's KV cache off (use_cache=False: a training step
keeps none) and unpacked batches. Every storage is counted, rounded to 512 bytes as the CUDA
caching allocator counts memory_allocated (trace/_step.py).

Device: a fake `cuda` device (trace/_fake_cuda.py: a small C++ extension, built once, gives a
torch without a GPU, CPU or CUDA build, the CUDA device guard and hooks autograd needs), so the
CUDA paths run: CUDA autocast op lists, the fused dropout (a bool mask), and the attention kernel
a Hopper GPU picks (trace/_sdpa.py: flash by default). Without a C++ compiler the step falls
back to fake CPU tensors, with a note in the result: CPU autocast op lists differ from CUDA's
(GPT-2 amp -10%).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

PRECISIONS_TRACED = ("fp32", "bf16", "amp-bf16")
OPTIMIZERS_TRACED = ("adamw", "adamw-fused", "adamw-loop", "sgd", "sgd-momentum")
DEVICES = ("cuda", "cpu")
CPU_FALLBACK_NOTE = (
    "traced on fake CPU tensors ({reason}): CPU autocast op lists and kernels differ from CUDA's"
)


def import_torch() -> Any:
    """torch, or a one-line ValueError saying how to install the trace extra."""
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ValueError(
            f"trace: needs torch and transformers ({exc.name} missing); "
            "install them with: pip install 'trainmem[trace]'"
        ) from None
    return torch


def check_flags(*, precision: str, recompute: str, optimizer: str, device: str) -> None:
    """One-line ValueErrors for flags the trace does not support."""
    if precision not in PRECISIONS_TRACED:
        raise ValueError(f"precision: trace supports fp32, bf16, amp-bf16; got '{precision}'")
    if recompute not in ("none", "full"):
        raise ValueError(f"recompute: trace supports none, full; got '{recompute}'")
    if optimizer not in OPTIMIZERS_TRACED:
        raise ValueError(
            f"optimizer: trace supports {', '.join(OPTIMIZERS_TRACED)}; got '{optimizer}'"
        )
    if device not in DEVICES:
        raise ValueError(f"device: trace supports cuda (fake) or cpu; got '{device}'")


@contextlib.contextmanager
def _cuda_like_dropout() -> Iterator[None]:
    """On CPU tensors, route dropout through native_dropout (CUDA's fused kernel, a bool mask
    saved) instead of the CPU's multiply by a mask in the input's dtype.

    Source: aten/src/ATen/native/Dropout.cpp is_fused_kernel_acceptable (CUDA only)."""
    import torch

    plain = torch.nn.functional.dropout

    def dropout(x: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if not training or p == 0.0:
            return x
        return torch.native_dropout(x, p, True)[0]

    torch.nn.functional.dropout = dropout  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.nn.functional.dropout = plain  # type: ignore[assignment]


def in_child_if_needed(function: str, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """function(**kwargs) in a fresh process when this one's autograd engine started before the
    fake `cuda` device existed (see _fake_cuda.py); None when the trace can run here. One level
    only: in a trace child (_child.is_child) this raises a one-line ValueError naming the torch
    build instead of starting another process."""
    from ._child import is_child, no_second_child_error, run_in_child
    from ._fake_cuda import autograd_sees_fake_cuda, fake_cuda_unavailable_reason

    if fake_cuda_unavailable_reason() or autograd_sees_fake_cuda():
        return None
    if is_child():
        raise no_second_child_error()
    return run_in_child(function, kwargs)


def step_contexts(*, device: str, fake: bool, sdpa_kernel: str) -> tuple[str, list[Any], str]:
    """(device type, contexts to run the step in, note) for a traced step on `device`."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ._fake_cuda import fake_cuda_device, fake_cuda_unavailable_reason
    from ._norm import gpu_rms_norm
    from ._sdpa import gpu_attention_kernels

    note = ""
    if device == "cuda" and fake:
        reason = fake_cuda_unavailable_reason()
        if not reason:
            return (
                "cuda",
                [
                    fake_cuda_device(),
                    gpu_attention_kernels(sdpa_kernel),
                    gpu_rms_norm(),
                    FakeTensorMode(),
                ],
                note,
            )
        device, note = "cpu", CPU_FALLBACK_NOTE.format(reason=reason)
    if device == "cuda":  # real tensors on a real GPU: the real kernel chooser
        if not torch.cuda.is_available():
            raise ValueError("device: no CUDA device here (torch.cuda.is_available() is False)")
        return "cuda", [], note
    contexts: list[Any] = [_cuda_like_dropout()]
    if fake:
        contexts.append(FakeTensorMode())
    return "cpu", contexts, note


@contextlib.contextmanager
def unpacked_batches() -> Iterator[None]:
    """transformers looks for packed sequences in the position ids and, on fake tensors (whose
    values it cannot read), assumes a packed batch and builds a [b, 1, s, s] mask that rules out
    the flash kernel. The traced batches are unpacked: say so.

    Source: transformers/masking_utils.py find_packed_sequence_indices, _preprocess_mask_arguments
    (only without a cache and an attention mask, i.e. in training)."""
    from transformers import masking_utils

    plain = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = plain


def enable_hf_checkpointing(model: Any) -> None:
    """HF's checkpointing of every GradientCheckpointingLayer, as the Trainer turns it on
    (transformers 5.24 names it activation_checkpointing_enable; gradient_checkpointing_enable
    before)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    (enable or model.gradient_checkpointing_enable)()


def hf_job(
    config: dict[str, Any],
    *,
    micro_batch_size: int,
    seq_len: int,
    precision: str,
    attention: str,
    device_type: str,
) -> Callable[[], Any]:
    """A builder of the Hugging Face causal-LM step (model from config, no weights, no hub)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ._step import StepJob

    fields = {k: v for k, v in config.items() if not k.startswith("_")}
    model_type = fields.pop("model_type", "llama")
    fields.pop("architectures", None)
    if attention == "flash" and device_type == "cpu":
        # The CPU flash kernel has no dropout; the CUDA one applies it in-kernel (philox state
        # only, no mask saved), so a zero attention dropout keeps the CPU on the same kernel.
        for key in ("attn_pdrop", "attention_dropout", "attention_probs_dropout_prob"):
            if key in fields or model_type in ("gpt2", "bert"):
                fields[key] = 0.0
    cfg = AutoConfig.for_model(model_type, **fields)
    cfg._attn_implementation = "sdpa" if attention == "flash" else "eager"
    cfg.use_cache = False  # a training step keeps no KV cache (GPT-2 would copy k and v into one)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32

    def loss(model: Any, ids: Any) -> Any:
        return model(input_ids=ids, labels=ids).loss

    def build() -> Any:
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        ids = torch.randint(0, cfg.vocab_size, (micro_batch_size, seq_len))
        return StepJob(model=model, batch=ids, loss=loss, enable_recompute=enable_hf_checkpointing)

    return build


def lora_flags(*, lora_rank: int, lora_targets: str, qlora: bool, tp: int = 1) -> dict[str, Any]:
    """The LoRA flags to pass on ({} without LoRA: the plain step's calls stay as they were),
    checked (trace/_lora.py check_lora)."""
    if not lora_rank and not qlora:
        return {}
    from ._lora import check_lora

    check_lora(lora_rank=lora_rank, lora_targets=lora_targets, qlora=qlora, tp=tp)
    return {"lora_rank": lora_rank, "lora_targets": lora_targets}


def trace_step(
    config: dict[str, Any],
    *,
    micro_batch_size: int,
    seq_len: int,
    precision: str,
    recompute: str,
    attention: str,
    optimizer: str,
    device: str = "cuda",
    sdpa_kernel: str = "flash",
    fake: bool = True,
    on_phase_end: Callable[[str], None] | None = None,
    lora_rank: int = 0,
    lora_targets: str = "all-linear",
    qlora: bool = False,
    snapshot: str | None = None,
) -> dict[str, Any]:
    """One measured step of a Hugging Face causal LM built from `config` (a config.json dict).

    Returns bytes (ints, per device): parameters_bytes, gradients_bytes, optimizer_states_bytes
    (the optimizer's tensors on the device: fused AdamW's step counters too, foreach AdamW keeps
    them on the host), activations_bytes (alive
    at the end of forward: saved for backward, the loss, autocast weight copies), its split
    activations_per_layer_bytes (mean over the repeated blocks), activations_by_layer_bytes,
    activations_outside_layers_bytes, activations_autocast_weight_copies_bytes; phases (peak live
    bytes of forward, backward, optimizer_step), peak_allocated_bytes, peak_phase;
    transient_bytes (the forward/backward peak less parameters, optimizer states and
    activations) and transient_phase; gradients_at_peak_bytes; num_layers, layer_class,
    layer_path, parameter counts (num_parameters, parameters_per_layer,
    parameters_outside_layers, trainable_parameters); device, note, elapsed_s.

    device "cuda" (default) traces on a fake CUDA device (falling back to fake CPU tensors, with
    a note, where the fake device cannot be built); "cpu" on fake CPU tensors. sdpa_kernel is the
    attention kernel a GPU would run (flash, efficient, cudnn, math; see _trace_sdpa.py).
    `fake=False` runs the same step on real tensors: bench/cpu_trace.py uses it on the CPU,
    --real-gpu on a CUDA device (on_phase_end then reads the allocator's statistics, see
    _trace_step.run_step). lora_rank > 0: peft LoRA adapters on `lora_targets` (trace/_lora.py);
    qlora is refused. snapshot: also write the traced allocations there as a PyTorch memory
    snapshot pickle (run_step's `snapshot`; `trainmem explain` reads it).
    """
    import_torch()
    check_flags(precision=precision, recompute=recompute, optimizer=optimizer, device=device)
    lora = lora_flags(lora_rank=lora_rank, lora_targets=lora_targets, qlora=qlora)
    flags: dict[str, Any] = {
        "micro_batch_size": micro_batch_size,
        "seq_len": seq_len,
        "precision": precision,
        "recompute": recompute,
        "attention": attention,
        "optimizer": optimizer,
        "sdpa_kernel": sdpa_kernel,
    }
    if snapshot is not None:
        flags["snapshot"] = snapshot
    if device == "cuda" and fake and on_phase_end is None:
        done = in_child_if_needed("trace_step", {"config": config, **flags, **lora})
        if done is not None:
            return done
    return _run_hf_step(
        config, device=device, fake=fake, on_phase_end=on_phase_end, lora=lora, **flags
    )


def _run_hf_step(
    config: dict[str, Any],
    *,
    micro_batch_size: int,
    seq_len: int,
    precision: str,
    recompute: str,
    attention: str,
    optimizer: str,
    sdpa_kernel: str,
    device: str,
    fake: bool,
    on_phase_end: Callable[[str], None] | None,
    lora: dict[str, Any],
    snapshot: str | None = None,
) -> dict[str, Any]:
    """trace_step in this process, its flags checked: the step's contexts on `device`, the
    model (with LoRA adapters where `lora`, lora_flags' result), the measured step, and where it
    ran. Split from trace_step so that a trace child and this process run the same code."""
    from ._step import run_step

    device_type, contexts, note = step_contexts(device=device, fake=fake, sdpa_kernel=sdpa_kernel)
    build = hf_job(
        config,
        micro_batch_size=micro_batch_size,
        seq_len=seq_len,
        precision=precision,
        attention=attention,
        device_type=device_type,
    )
    if lora:
        from ._lora import with_lora

        build = with_lora(build, precision=precision, **lora)
    out = run_step(
        build,
        precision=precision,
        recompute=recompute,
        optimizer=optimizer,
        device_type=device_type,
        contexts=[*contexts, unpacked_batches()],
        on_phase_end=on_phase_end,
        full_warm_up=not fake,
        snapshot=snapshot,
    )
    out.update(
        device=f"{device_type} (fake)" if fake else device_type,
        note=note,
        seq_len=seq_len,
        micro_batch_size=micro_batch_size,
    )
    return out
