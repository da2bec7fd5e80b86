"""fp8 training recipes (Transformer Engine): cached fp8 weights and delayed-scaling state.

Activations stay in bf16 under these recipes (engine/_precision.py, "fp8-mixed"), so fp8 adds
device bytes for the weights only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ._states import LocalTensor

FP8_WEIGHT_CACHE_BYTES = 2.0
"""fp8 copies of each linear weight kept from forward to backward: row-wise and column-wise
(transposed) fp8 on Hopper, 1 byte each. Source: Transformer Engine `Linear`
(transformer_engine/pytorch/module/linear.py: the fp8 weight workspace cached across
micro-batches; `columnwise` usage for the wgrad/dgrad GEMMs)."""
FP8_SCALING_BYTES_PER_LINEAR = 3 * 1024 * 4.0
"""Delayed-scaling state per fp8 GEMM operand: amax history (1024 entries, fp32) for input,
weight and grad. Source: transformer_engine/common/recipe: DelayedScaling(amax_history_len=1024)."""
FP8_GATHERED_BLOCKS = 2.0
"""Under ZeRO-3/FSDP the fp8 casts happen per gathered block: the current and the prefetched
block's weights are cast at a time."""


def fp8_cache_bytes(
    full: Sequence[LocalTensor],
    *,
    fp8,
    params_sharded,
    num_layers: np.ndarray,
    dp: np.ndarray,
    cache_bytes_per_element=FP8_WEIGHT_CACHE_BYTES,
    scaling_bytes_per_linear=FP8_SCALING_BYTES_PER_LINEAR,
) -> np.ndarray:
    """Bytes of the quantized weight caches and scaling state on one rank (0 off the recipes).

    `full`: the rank's unsharded tensors; `params_sharded`: ZeRO-3/FSDP rows; `num_layers`:
    blocks on the rank's stage; `cache_bytes_per_element`, `scaling_bytes_per_linear`: the
    recipe's (per row: fp8-mixed's defaults, or _mx.py's WEIGHT_CACHE_BYTES and
    SCALING_BYTES_PER_LINEAR by precision code for mxfp8 and nvfp4).
    Source: FP8_WEIGHT_CACHE_BYTES, FP8_SCALING_BYTES_PER_LINEAR; _mx.py.
    Assumes: every block linear runs quantized (the embedding and head stay 16-bit, as in TE).
    """
    linear_numel = sum(
        (t.numel * t.count for t in full if t.tensor.is_block_linear), np.zeros_like(dp)
    )
    num_linears = sum((t.count for t in full if t.tensor.is_block_linear), np.zeros_like(dp))
    cached_numel = np.where(
        params_sharded,
        linear_numel / np.maximum(num_layers, 1.0) * FP8_GATHERED_BLOCKS,
        linear_numel,
    )
    return np.where(
        fp8,
        cache_bytes_per_element * cached_numel + scaling_bytes_per_linear * num_linears,
        0.0,
    )
