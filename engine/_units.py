"""Units, dtype sizes and allocator rounding shared by every formula.

Bytes internally; GiB (2**30) only at the edges. Names carry their unit.
"""

from __future__ import annotations

import numpy as np

GIB = 2**30
"""One gibibyte (2**30 bytes): what the CLI and JSON `_gib` fields mean. Not a GB (10**9)."""

ALLOCATOR_BLOCK_BYTES = 512
"""The CUDA caching allocator rounds every allocation up to 512 bytes.

Source: c10/cuda/CUDACachingAllocator.cpp, `kMinBlockSize = 512`; memory_allocated() counts the
rounded size, and the ground truth (MemTracker) does the same.
"""

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "tf32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int64": 8.0,
    "bool": 1.0,
    "nf4": 0.5,
}
"""Bytes per element. Floats, so that sub-byte types (nf4: 4 bits) are exact (no `4 // 8 == 0`)."""


def round_to_block(num_bytes: np.ndarray | float) -> np.ndarray:
    """Round byte counts up to the allocator block (512 B), elementwise.

    Source: c10/cuda/CUDACachingAllocator.cpp `round_size` (kMinBlockSize = 512).
    Assumes: every tensor is its own allocation (true for parameters, gradients, optimizer states
    and saved activations in eager PyTorch).
    """
    return np.ceil(np.asarray(num_bytes, dtype=np.float64) / ALLOCATOR_BLOCK_BYTES) * (
        ALLOCATOR_BLOCK_BYTES
    )
