"""Framework overhead outside what PyTorch's allocator counts as allocated.

Every default is a named parameter with its source, overridable (CLI `--overhead KEY=VALUE`) and
calibratable from one measured run.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

MIB = 2**20


@dataclass(frozen=True, slots=True, kw_only=True)
class Overheads:
    """Overhead parameters (bytes, or fractions where named so)."""

    cuda_context_bytes: float = 804_061_184
    """Device memory outside PyTorch's allocator after a training step: CUDA context, lazily
    loaded kernels, cuBLAS/cuDNN handles. Not in max_memory_reserved.
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
            high = " and < 1" if key.endswith("_fraction") else ""
            if not (np.isfinite(value) and value >= 0 and (not high or value < 1)):
                rule = "in [0, 1)" if high else "finite and >= 0"
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
