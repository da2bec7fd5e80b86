"""Framework overhead outside what PyTorch's allocator counts as allocated.

Every default is a named parameter with its source, overridable (CLI `--overhead KEY=VALUE`) and
calibratable from one measured run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from types import MappingProxyType

import numpy as np

MIB = 2**20
"""Bytes in one MiB."""

SM90_STEP_CONTEXT_BYTES = 804_061_184
"""CUDA context after a training step on an H200 (sm90): NVML used minus torch reserved.
Source: measured, torch 2.11.0+cu130, driver 580.x, lazy module loading
(tests/data/gpu_calibration_h200.json, all three cases)."""

SM90_INIT_CONTEXT_BYTES = 648_871_936
"""The same H200's context right after CUDA init, before the first kernel of the step.
Source: tests/data/gpu_calibration_h200.json (measured with SM90_STEP_CONTEXT_BYTES)."""

STEP_LAZY_MODULES_BYTES = SM90_STEP_CONTEXT_BYTES - SM90_INIT_CONTEXT_BYTES
"""What one training step adds to the context after init (155,189,248 B): the modules of the
kernels it launches, loaded on first use under CUDA_MODULE_LOADING=LAZY (the default since CUDA
11.7 with torch >= 1.13, pytorch PR #86509), cuBLAS/cuDNN handles and the growth of the
context's local-memory allocation (threads per SM x SMs x bytes per thread, NVIDIA forums
'Local memory management').
Source: SM90_STEP_CONTEXT_BYTES - SM90_INIT_CONTEXT_BYTES.
Assumes: the same on every generation (no step-level measurement exists for another GPU)."""

SM100_INIT_CONTEXT_BYTES = 612 * MIB
"""CUDA context right after init on a B200 (sm100): 612 MiB per process
(`nvidia-smi --query-compute-apps` after `torch.cuda.mem_get_info(0)`, still there after
empty_cache). Source: unslothai/unsloth PR #8669 (2026-08; torch version not stated)."""

SM89_INIT_CONTEXT_BYTES = 426 * MIB
"""CUDA context right after init on an RTX 6000 Ada (sm89): 426 MiB in nvidia-smi after
`torch.cuda.mem_get_info(0)`, torch allocated and reserved 0.
Source: unslothai/unsloth-zoo PR #1053 (torch 2.10.0+cu130)."""

SM70_EAGER_CONTEXT_BYTES = 1343 * MIB
"""CUDA context on a V100-SXM2-16GB (sm70) after `torch.ones((1, 1)).to("cuda")`: NVML used
1,343 MiB (`info.used // 1024**2`), with driver 460.91.03 (CUDA 11.2): before lazy module
loading, so every kernel of torch's CUDA libraries is loaded at init.
Source: huggingface/transformers docs/source/en/model_memory_anatomy.md (the HF Trainer
walk-through; nvidia-smi shows 'Tesla V100-SXM2... 2631MiB / 16160MiB' once the model is in).
Assumes: eager loading, as measured: the only published V100 figure (a judgement on the side of
not calling an OOM a fit: torch's CUDA 13 wheels drop sm70, so V100s stay on CUDA 11/12 builds,
often on old drivers). Lazy loading is "a joint feature of both the CUDA runtime
and driver" (CUDA Programming Guide, Lazy Loading, Requirements): a runtime before 11.7 or a
driver older than CUDA 11.7's (R515) loads eagerly. On a lazy-loading stack (torch cu118/cu126,
driver R515+) the context is nearer CONTEXT_BYTES_BY_ARCH's lazy figures, about 0.6 GiB less:
set the GPU's TOML `cuda_context_bytes` or `--overhead cuda_context_bytes=`."""

CONTEXT_BYTES_BY_ARCH: Mapping[str, float] = MappingProxyType(
    {
        "sm70": SM70_EAGER_CONTEXT_BYTES,
        "sm89": SM89_INIT_CONTEXT_BYTES + STEP_LAZY_MODULES_BYTES,
        "sm100": SM100_INIT_CONTEXT_BYTES + STEP_LAZY_MODULES_BYTES,
    }
)
"""Default CUDA context after a training step per architecture, for the generations with a
published measurement of their own: the eager V100 figure as measured; Ada and datacenter
Blackwell as their measured context at init plus the step's lazily loaded modules measured on
sm90. Every other architecture (sm75, sm80, sm86, sm90, sm120, cdna*) keeps the measured sm90
figure (SM90_STEP_CONTEXT_BYTES): no per-generation measurement was found for them (see
docs/concepts.md#overheads for the evidence table)."""


MAX_OVERHEAD = 2.0**50
"""An overhead in bytes (or a factor) up to 1 PiB: beyond any device, below any overflow; the
GPU's own memory bounds the bytes further (report/_validate.check_overhead_bytes)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Overheads:
    """Overhead parameters (bytes, or fractions where named so)."""

    cuda_context_bytes: float = SM90_STEP_CONTEXT_BYTES
    """Device memory outside PyTorch's allocator after a training step: CUDA context, lazily
    loaded kernels, cuBLAS/cuDNN handles. Not in max_memory_reserved. This is the sm90 value;
    a GPU's own default is its TOML `cuda_context_bytes`, else `cuda_context_bytes_for(arch)`
    (`overheads_for`).
    Source: measured, H200, torch 2.11.0+cu130 (tests/data/gpu_calibration_h200.json: NVML used
    minus torch reserved = 804,061,184 B in all three cases; 648,871,936 B right after CUDA init).
    Published: 287 MB (PyTorch PR #86509, lazy loading, one small tensor), about 400 MB
    (pytorch#109888), 426 MiB (unsloth-zoo PR #1053)."""
    nccl_bytes_per_communicator: float = 544 * MIB
    """NCCL buffers per communicator (process group with more than one rank).
    Source: NVIDIA/nccl #964 (544 MB for a 2-rank group, 688 MB for more, 4xA100 NVLink);
    default NCCL_BUFFSIZE 4 MiB per channel and peer (#285). Not in max_memory_reserved."""
    fragmentation_fraction: float = 0.12
    """Caching-allocator slack (reserved - allocated - workspace) as a fraction of the
    non-persistent bytes at the peak (activations + transients).
    Source: measured on H200 (tests/data/gpu_calibration_h200.json): 6.8% (llama-2-7b bf16,
    peak in the optimizer step), 12.0% (llama-3.2-1b amp), 49.9% (tinyllama mb8 with
    checkpointing, peak at two 2.1 GB fp32 loss gradients); the median is the default. Published:
    GMLake (ASPLOS'24) 15% average on 8 LLMs; torchtune #1185 up to 34% for QLoRA.
    Assumes: the native allocator (see expandable_segments_fragmentation_fraction)."""
    fragmentation_largest_block_factor: float = 1.0
    """Caching-allocator slack of at least this many times the step's largest tensor (the loss's
    [tokens, vocab] fp32 tensor at the start of backward): it needs a segment of its own while
    freed smaller blocks stay cached (the fragmentation is the larger of this and
    fragmentation_fraction's). Native allocator only.
    Source: measured, H200 (tests/data/gpu_calibration_h200.json): 2.0 GiB of slack over a 1.96
    GiB loss tensor (llama-3.2-1b), 3.8 GiB over 1.95 (tinyllama mb8); published torchtitan
    Llama-3.1-8B max reserved less the traced allocated peak: 14.3 GiB over 7.83 (8 GPUs), 9.4
    over 7.83 (128 GPUs), 15.7 over 15.66 (32k tokens); trace/_allocator.py's replay of the
    8-GPU step: 8.4-9.6 GiB. The factor is the lower end (1.0); multi-stream FSDP pools and
    warm-up history add more."""
    expandable_segments_fragmentation_fraction: float = 0.03
    """The same slack under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (`--allocator
    expandable-segments`): segments grow in 2 MiB pages and unmapped pages are returned, so
    what is left is page rounding and blocks freed inside mapped pages.
    Source: torch/csrc/c10/cuda/CUDACachingAllocator.cpp (ExpandableSegment); published: a
    torchtune QLoRA run (Llama-3-8B, A100) 16.39 -> 10.83 GiB reserved with it
    (meta-pytorch/torchtune #1185), GMLake (ASPLOS'24) fragmentation 15% average without.
    Assumes: 3% (a judgement, not measured here: calibrate with --overhead when measured)."""
    cublas_workspace_bytes: float = 64 * MIB
    """cuBLAS + cuBLASLt workspaces on sm90+, allocated through the caching allocator: they show
    in max_memory_allocated on a GPU (the traced ground truth excludes them) and in reserved.
    Source: measured, H200, torch 2.11 (max_memory_allocated - traced peak = 67,109,376,
    68,157,952 and 67,109,888 B); aten/src/ATen/cuda/CublasHandlePool.cpp (`:4096:8` = 32 MiB
    per handle on sm90; pre-Hopper `:4096:2:16:8` = 8 MiB + 128 KiB; hipBLASLt 76 MiB)."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def with_overrides(self, overrides: dict[str, float]) -> Overheads:
        unknown = sorted(set(overrides) - set(self.names()))
        if unknown:
            raise ValueError(
                f"overhead: unknown key '{unknown[0]}'; allowed: {', '.join(self.names())}"
            )
        for key, value in overrides.items():
            fraction = key.endswith("_fraction")
            if not (0 <= value < 1 if fraction else 0 <= value <= MAX_OVERHEAD):  # NaN fails
                rule = "in [0, 1)" if fraction else f"in [0, {MAX_OVERHEAD:g}] (2^50)"
                raise ValueError(f"overhead: {key} must be {rule}, got {value}")
        return replace(self, **overrides)


def cublas_workspace_bytes_for(arch: str) -> float:
    """Default cuBLAS(+Lt) workspace for a GPU architecture string such as "sm90" or "cdna3".

    Source: aten/src/ATen/cuda/CublasHandlePool.cpp (see Overheads.cublas_workspace_bytes).
    """
    if arch.startswith("cdna"):
        return 76 * MIB
    digits = "".join(ch for ch in arch if ch.isdigit())
    if digits and int(digits) >= 90:
        return 64 * MIB  # measured on H200 (see Overheads.cublas_workspace_bytes)
    return 2 * (8 * MIB + 128 * 1024)  # cuBLAS + cuBLASLt, `:4096:2:16:8` each


def cuda_context_bytes_for(arch: str) -> float:
    """Default CUDA context (bytes after a training step, outside torch's allocator) for a GPU
    architecture string such as "sm70", "sm90" or "cdna3".

    Source: CONTEXT_BYTES_BY_ARCH (cited per entry), else SM90_STEP_CONTEXT_BYTES.
    Assumes: torch's default CUDA_MODULE_LOADING=LAZY except on sm70 (see
    SM70_EAGER_CONTEXT_BYTES); one process per GPU; HIP contexts on cdna as the sm90 figure.
    Ignores: CUDA version and driver differences within a generation.
    """
    return float(CONTEXT_BYTES_BY_ARCH.get(arch, SM90_STEP_CONTEXT_BYTES))


def overheads_for(arch: str, *, cuda_context_bytes: float | None = None) -> Overheads:
    """The default Overheads of one GPU: its architecture's cuBLAS workspace and CUDA context,
    or `cuda_context_bytes` where its profile names one (a GPU TOML's `cuda_context_bytes`).

    Source: cublas_workspace_bytes_for, cuda_context_bytes_for.
    """
    context = cuda_context_bytes_for(arch) if cuda_context_bytes is None else cuda_context_bytes
    return Overheads(
        cuda_context_bytes=float(context),
        cublas_workspace_bytes=cublas_workspace_bytes_for(arch),
    )


def num_communicators(*, dp, tp, pp, cp) -> np.ndarray:
    """Process groups of more than one rank that a rank joins (data, tensor, pipeline, context).

    Assumes: one NCCL communicator per such group (ncclCommSplit sharing not assumed).
    """
    return (
        (np.asarray(dp) > 1).astype(np.float64)
        + (np.asarray(tp) > 1)
        + (np.asarray(pp) > 1)
        + (np.asarray(cp) > 1)
    )
