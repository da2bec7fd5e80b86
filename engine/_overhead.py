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

    cuda_context_bytes: float = 426 * MIB
    """CUDA context + PyTorch kernels with lazy module loading (the default since PyTorch 1.13).
    Source: unsloth-zoo PR #1053 (426 MiB, torch 2.10 + cu130); PyTorch PR #86509 (287 MB,
    CUDA_MODULE_LOADING=LAZY); pytorch#109888 (about 400 MB). Not in max_memory_reserved."""
    nccl_bytes_per_communicator: float = 544 * MIB
    """NCCL buffers per communicator (process group with more than one rank).
    Source: NVIDIA/nccl #964 (544 MB for a 2-rank group, 688 MB for more, 4xA100 NVLink);
    default NCCL_BUFFSIZE 4 MiB per channel and peer (#285). Not in max_memory_reserved."""
    fragmentation_fraction: float = 0.07
    """Caching-allocator slack (reserved - allocated) as a fraction of the non-persistent bytes
    (activations + transients) at the peak. Source: reference range 5-10% (GMLake, ASPLOS'24:
    15% average over all memory on 8 LLMs; vllm compressed-tensors #587: 2% of a 78 GiB offload
    job; torchtune #1185: up to 34% for QLoRA without expandable_segments)."""
    cublas_workspace_bytes: float = 33 * MIB
    """cuBLAS workspace (32 MiB on sm90+) + cuBLASLt workspace (1 MiB), one stream, inside
    reserved. Source: aten/src/ATen/cuda/CublasHandlePool.cpp (`:4096:8` on sm90; pre-Hopper
    `:4096:2:16:8` = 8 MiB + 128 KiB; hipBLASLt 76 MiB on ROCm)."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def with_overrides(self, overrides: dict[str, float]) -> Overheads:
        unknown = sorted(set(overrides) - set(self.names()))
        if unknown:
            raise ValueError(
                f"overhead: unknown key '{unknown[0]}'; allowed: {', '.join(self.names())}"
            )
        return replace(self, **overrides)


def cublas_workspace_bytes_for(arch: str) -> float:
    """Default cuBLAS(+Lt) workspace for a GPU architecture string such as "sm90" or "cdna3".

    Source: aten/src/ATen/cuda/CublasHandlePool.cpp (see Overheads.cublas_workspace_bytes).
    """
    if arch.startswith("cdna"):
        return 76 * MIB
    digits = "".join(ch for ch in arch if ch.isdigit())
    if digits and int(digits) >= 90:
        return 33 * MIB
    return 8 * MIB + 128 * 1024 + 1 * MIB


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
