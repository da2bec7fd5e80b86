"""`trainmem trace --num-gpus N --zero 3`: one rank of an FSDP2 job on a fake process group.

Rank 0 of N runs in this process: torch.distributed is initialised with the "fake" backend (every
collective returns at once, with outputs of the right shapes) and a device mesh of N fake `cuda`
devices. The Hugging Face model is built fp32, activation checkpointing enabled if asked, then
torch.distributed.fsdp.fully_shard is applied to each decoder layer and to the root, with
MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32) for mixed-bf16: the fp32 shards
are the master weights, the bf16 all-gathered copies the working ones. Layers reshard after
forward; the root keeps FSDP2's default of not resharding. AdamW (foreach) steps the shards.

FSDP2 drives its copies and collectives through CUDA streams and events; on the fake device those
are stand-ins that do nothing (the ops run in program order), as on a real GPU whose streams are
synchronised. The byte tracker sees the shards, the all-gathered parameters, the reduce-scatter
inputs and the activations as FSDP2 allocates them.

Source: torch/distributed/fsdp/_fully_shard/_fully_shard.py (fully_shard, reshard_after_forward
None: True below the root, False at it), _fsdp_param_group.py (streams, events),
_fsdp_collectives.py (all-gather and reduce-scatter buffers), torch/testing/_internal/
distributed/fake_pg.py (FakeStore), torch 2.13.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from ._tp import FRAMEWORK as TP_FRAMEWORK
from ._tp import check_tp, tp_precisions

FSDP_PRECISIONS = ("mixed-bf16", "fp32", "bf16")


def check_parallel(
    *, num_gpus: int, zero: int, tp: int, sequence_parallel: bool, module: str | None
) -> None:
    """One-line ValueErrors for the layouts the multi-GPU trace does not run: FSDP2 (--zero 3)
    over num-gpus ranks, or tensor parallelism over num-gpus = tp ranks (trace/_tp.py); never
    pipeline or context parallelism (no flag reaches here)."""
    if module:
        raise ValueError("num-gpus: --module traces one GPU; a multi-GPU trace needs --model")
    if sequence_parallel and tp < 2:
        raise ValueError("sequence-parallel: needs --tp >= 2 (it splits the norms over tp ranks)")
    if tp > 1:
        check_tp(num_gpus=num_gpus, zero=zero, tp=tp)
        return
    if zero != 3 or num_gpus < 2:
        raise ValueError(
            f"zero: a multi-GPU trace is FSDP2: --zero 3 with --num-gpus >= 2 (got zero {zero}, "
            f"num-gpus {num_gpus})"
        )


class _Event:
    """A CUDA event that is always complete."""

    def record(self, stream: Any = None) -> _Event:
        return self

    def wait(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


class _Stream:
    """A CUDA stream whose work is already done (fake tensors run in program order)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        return None

    def wait_stream(self, stream: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> Any:
        return event or _Event()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


_DEFAULT_STREAM = _Stream()
FAKE_CUDA_HANDLE = types.SimpleNamespace(
    current_device=lambda: 0,
    set_device=lambda device: None,
    device_count=lambda: 8,
    is_available=lambda: True,
    synchronize=lambda *args: None,
    Stream=_Stream,
    Event=lambda *args, **kwargs: _Event(),
    current_stream=lambda *args, **kwargs: _DEFAULT_STREAM,
    stream=lambda stream: contextlib.nullcontext(),
)
"""What FSDP2 asks of torch.cuda (its `device_handle`), on the fake device."""


@contextlib.contextmanager
def fake_fsdp_device_handle() -> Iterator[None]:
    """FSDP2's modules get FAKE_CUDA_HANDLE from _get_device_handle for the duration."""
    from torch.distributed.fsdp._fully_shard import (
        _fsdp_collectives,
        _fsdp_init,
        _fsdp_param_group,
        _fsdp_state,
    )

    modules = (_fsdp_collectives, _fsdp_init, _fsdp_param_group, _fsdp_state)
    saved = [m._get_device_handle for m in modules]  # type: ignore[attr-defined]
    for m in modules:
        m._get_device_handle = lambda device_type: FAKE_CUDA_HANDLE  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for m, plain in zip(modules, saved, strict=True):
            m._get_device_handle = plain  # type: ignore[attr-defined]


@contextlib.contextmanager
def fake_process_group(world_size: int) -> Iterator[None]:
    """torch.distributed on the "fake" backend as rank 0 of `world_size`, for the duration."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise ValueError("num-gpus: torch.distributed is already initialised in this process")
    dist.init_process_group(backend="fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def rank_base_job(
    config: dict[str, Any], *, micro_batch_size: int, seq_len: int, precision: str, attention: str
) -> Callable[[], Any]:
    """The HF step one rank of a multi-GPU trace starts from, on the fake cuda device: fp32
    weights (a bf16 model only for `bf16`; mixed-bf16 and amp-bf16 get their 16-bit compute from
    the parallel wrapper or autocast)."""
    from ._core import hf_job

    return hf_job(
        config,
        micro_batch_size=micro_batch_size,
        seq_len=seq_len,
        precision="bf16" if precision == "bf16" else "fp32",
        attention=attention,
        device_type="cuda",
    )


def wrapped_step(job: Any, model: Any) -> Any:
    """The StepJob of a model already laid out over ranks (its recompute already enabled):
    the step enables nothing more and warms up the whole step."""
    from ._step import StepJob

    return StepJob(
        model=model,
        batch=job.batch,
        loss=job.loss,
        enable_recompute=lambda m: None,
        full_warm_up=True,
        dtypes_set=job.dtypes_set,
    )


def fsdp_job(
    config: dict[str, Any],
    *,
    num_gpus: int,
    micro_batch_size: int,
    seq_len: int,
    precision: str,
    recompute: str,
    attention: str,
    lora: dict[str, Any] | None = None,
) -> Callable[[], Any]:
    """A builder of the FSDP2 step (see the module docstring); `lora`: peft LoRA adapters
    wrapped before fully_shard (trace/_lora.py with_lora's flags)."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from ._step import find_blocks

    plain = rank_base_job(
        config,
        micro_batch_size=micro_batch_size,
        seq_len=seq_len,
        precision=precision,
        attention=attention,
    )
    if lora:
        from ._lora import with_lora

        plain = with_lora(plain, precision=precision, **lora)

    def build() -> Any:
        job = plain()
        model = job.model
        if recompute == "full" and job.enable_recompute is not None:
            job.enable_recompute(model)  # before wrapping, as the HF Trainer does
        with unset_fake_temporarily():  # the mesh holds real rank numbers
            mesh = init_device_mesh("cuda", (num_gpus,))
        policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if precision == "mixed-bf16"
            else MixedPrecisionPolicy()
        )
        for block in find_blocks(model)[1]:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        return wrapped_step(job, model)

    return build


@dataclass(frozen=True, kw_only=True)
class RankStep:
    """The layout and the step flags of one rank's traced step, as trace_parallel takes them
    (their names are its keywords, which a trace child is called with): one value passed to
    each part of the trace instead of eleven keywords restated at every call."""

    num_gpus: int
    zero: int
    tp: int
    sequence_parallel: bool
    micro_batch_size: int
    seq_len: int
    precision: str
    recompute: str
    optimizer: str
    attention: str
    sdpa_kernel: str


def trace_parallel(
    config: dict[str, Any],
    *,
    num_gpus: int,
    zero: int,
    tp: int,
    sequence_parallel: bool,
    micro_batch_size: int,
    seq_len: int,
    precision: str,
    recompute: str,
    optimizer: str,
    attention: str,
    sdpa_kernel: str = "flash",
    device: str = "cuda",
    lora_rank: int = 0,
    lora_targets: str = "all-linear",
    qlora: bool = False,
) -> dict[str, Any]:
    """One rank's measured step of an FSDP2 job (keys as trace_step's; bytes per rank).

    parameters_bytes are the rank's fp32 shards (the master weights under mixed-bf16),
    gradients_bytes its gradient shards, optimizer_states_bytes its states; the unsharded bf16
    copies count in the peaks and, while alive at the end of forward, in the activations (the
    root's, which FSDP2 keeps). lora_rank > 0: peft LoRA adapters (FSDP2 only, trace/_lora.py)."""
    from ._core import import_torch, in_child_if_needed, lora_flags

    import_torch()
    step = RankStep(
        num_gpus=num_gpus,
        zero=zero,
        tp=tp,
        sequence_parallel=sequence_parallel,
        micro_batch_size=micro_batch_size,
        seq_len=seq_len,
        precision=precision,
        recompute=recompute,
        optimizer=optimizer,
        attention=attention,
        sdpa_kernel=sdpa_kernel,
    )
    check_rank_step(step, device=device)
    lora = lora_flags(lora_rank=lora_rank, lora_targets=lora_targets, qlora=qlora, tp=tp)
    done = in_child_if_needed("trace_parallel", {"config": config, **asdict(step), **lora})
    if done is not None:
        return done
    return _run_rank_step(config, step, lora=lora)


def check_rank_step(step: RankStep, *, device: str) -> None:
    """One-line ValueErrors for a multi-GPU trace it cannot run: the layout (check_parallel),
    then the precisions its wrapper takes (FSDP2's or TP's), the recompute, the device."""
    check_parallel(
        num_gpus=step.num_gpus,
        zero=step.zero,
        tp=step.tp,
        sequence_parallel=step.sequence_parallel,
        module=None,
    )
    tp = step.tp
    precisions = FSDP_PRECISIONS if tp == 1 else tp_precisions(num_gpus=step.num_gpus, tp=tp)
    if step.precision not in precisions:
        what = "FSDP2" if tp == 1 else "TP"
        raise ValueError(
            f"precision: the {what} trace supports {', '.join(precisions)}; got '{step.precision}'"
        )
    if step.recompute not in ("none", "full"):
        raise ValueError(f"recompute: trace supports none, full; got '{step.recompute}'")
    if device != "cuda":
        raise ValueError("device: the multi-GPU trace runs on the fake cuda device")


def rank_job(config: dict[str, Any], step: RankStep, *, lora: dict[str, Any]) -> Callable[[], Any]:
    """The builder of rank 0's step: tensor parallel (trace/_tp.py) for tp > 1, else FSDP2
    (fsdp_job, with LoRA adapters where `lora`)."""
    if step.tp > 1:
        from ._tp import tp_job

        return tp_job(
            config,
            num_gpus=step.num_gpus,
            tp=step.tp,
            zero=step.zero,
            sequence_parallel=step.sequence_parallel,
            micro_batch_size=step.micro_batch_size,
            seq_len=step.seq_len,
            precision=step.precision,
            recompute=step.recompute,
            attention=step.attention,
        )
    return fsdp_job(
        config,
        num_gpus=step.num_gpus,
        micro_batch_size=step.micro_batch_size,
        seq_len=step.seq_len,
        precision=step.precision,
        recompute=step.recompute,
        attention=step.attention,
        lora=lora,
    )


def _run_rank_step(
    config: dict[str, Any], step: RankStep, *, lora: dict[str, Any]
) -> dict[str, Any]:
    """trace_parallel in this process, its flags checked: rank 0's step on the fake cuda device
    inside the fake process group (the builder enables recompute as it lays the model out, so
    the step does not), and the rank and layout it ran."""
    from ._core import step_contexts, unpacked_batches
    from ._step import run_step

    device_type, contexts, note = step_contexts(
        device="cuda", fake=True, sdpa_kernel=step.sdpa_kernel
    )
    if device_type != "cuda":
        raise ValueError(f"num-gpus: the multi-GPU trace needs the fake cuda device ({note})")
    build = rank_job(config, step, lora=lora)
    out = run_step(
        build,
        precision=step.precision,
        recompute="none",
        optimizer=step.optimizer,
        device_type="cuda",
        contexts=[
            fake_process_group(step.num_gpus),
            fake_fsdp_device_handle(),
            *contexts,
            unpacked_batches(),
        ],
    )
    out.update(
        device="cuda (fake)",
        note=note,
        seq_len=step.seq_len,
        micro_batch_size=step.micro_batch_size,
        num_gpus=step.num_gpus,
        zero=step.zero,
        rank=0,
    )
    if step.tp > 1:
        out.update(tp=step.tp, sequence_parallel=step.sequence_parallel, framework=TP_FRAMEWORK)
    return out
