"""The columnar grid: one numpy array per training field, one row per configuration.

Categorical fields are stored as small integer codes (index into the vocabulary tuples below), so
the estimator is pure array arithmetic. A single configuration is a grid of one row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._states import lora_mask

PRECISIONS = (
    "fp32",
    "bf16",
    "fp16",
    "amp-bf16",
    "amp-fp16",
    "mixed-bf16",
    "mixed-fp16",
    "fp8-mixed",
)
OPTIMIZERS = ("adamw", "adamw-fused", "adamw-8bit", "sgd", "sgd-momentum", "adafactor", "lion")
RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("flash", "eager")
FRAMEWORKS = ("hf", "megatron", "deepspeed", "torchtitan")
OFFLOADS = ("none", "optimizer", "optimizer+params")
LOSSES = ("full", "chunked")

CATEGORICAL: dict[str, tuple[str, ...]] = {
    "precision": PRECISIONS,
    "optimizer": OPTIMIZERS,
    "recompute": RECOMPUTE,
    "attention": ATTENTION,
    "framework": FRAMEWORKS,
    "offload": OFFLOADS,
    "loss": LOSSES,
}

DEFAULTS: dict[str, Any] = {
    "micro_batch_size": 1,
    "seq_len": 2048,
    "num_gpus": 1,
    "global_batch_size": 0,
    "tp": 1,
    "pp": 1,
    "cp": 1,
    "virtual_stages": 1,
    "zero": 0,
    "sequence_parallel": False,
    "precision": "amp-bf16",
    "optimizer": "adamw",
    "recompute": "none",
    "attention": "flash",
    "framework": "hf",
    "ep": 1,
    "etp": 1,
    "capacity_factor_pct": 0,
    "offload": "none",
    "lora_rank": 0,
    "lora_targets": "all-linear",
    "qlora": False,
    "loss": "full",
    "activation_offload": False,
    "optimizer_custom": False,
    "optimizer_num_states": 0.0,
    "optimizer_state_bytes": 0.0,
    "optimizer_temp_states": 0.0,
    "optimizer_eight_bit": False,
    "optimizer_step_bytes": 0.0,
}
"""Every grid field and its default. `global_batch_size` 0 means micro_batch_size x dp (no
gradient accumulation). The `optimizer_*` fields describe a user optimizer (a TOML file, see
_optimizers.py) and apply only where `optimizer_custom` is true."""

FLOAT_FIELDS = (
    "optimizer_num_states",
    "optimizer_state_bytes",
    "optimizer_temp_states",
    "optimizer_step_bytes",
)
BOOL_FIELDS = (
    "sequence_parallel",
    "qlora",
    "activation_offload",
    "optimizer_custom",
    "optimizer_eight_bit",
)

INT_FIELDS = (
    "micro_batch_size",
    "seq_len",
    "num_gpus",
    "global_batch_size",
    "tp",
    "pp",
    "cp",
    "virtual_stages",
    "zero",
    "ep",
    "etp",
    "capacity_factor_pct",
    "lora_rank",
)

Grid = dict[str, np.ndarray]


def encode(field: str, values: Any) -> np.ndarray:
    """Codes for a categorical column given as names (or codes already)."""
    vocab = CATEGORICAL[field]
    arr = np.asarray(values)
    if arr.dtype.kind in "iu":
        bad = (arr < 0) | (arr >= len(vocab))
        if np.any(bad):
            raise ValueError(f"{field}: code out of range; allowed: {', '.join(vocab)}")
        return arr.astype(np.int8)
    lookup = {name: i for i, name in enumerate(vocab)}
    flat = [str(v) for v in np.ravel(arr)]
    unknown = sorted({v for v in flat if v not in lookup})
    if unknown:
        raise ValueError(f"{field}: unknown value '{unknown[0]}'; allowed: {', '.join(vocab)}")
    return np.array([lookup[v] for v in flat], dtype=np.int8).reshape(arr.shape)


def decode(field: str, codes: np.ndarray) -> np.ndarray:
    """Names for a categorical column's codes."""
    return np.asarray(CATEGORICAL[field], dtype=object)[np.asarray(codes, dtype=np.int64)]


def make_grid(columns: Mapping[str, Any] | None = None, **kwargs: Any) -> Grid:
    """Build a grid from columns (lists, arrays or scalars; scalars broadcast).

    Unknown field names and unknown categorical values raise ValueError naming them.
    """
    given = {**(columns or {}), **kwargs}
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise ValueError(
            f"unknown grid field(s): {', '.join(unknown)}; allowed: {', '.join(DEFAULTS)}"
        )
    merged = {**DEFAULTS, **given}
    arrays: dict[str, np.ndarray] = {}
    for name, value in merged.items():
        if name in CATEGORICAL:
            arrays[name] = encode(name, value)
        elif name in BOOL_FIELDS:
            arrays[name] = np.asarray(value, dtype=bool)
        elif name in FLOAT_FIELDS:
            arrays[name] = np.asarray(value, dtype=np.float64)
            if not np.all(np.isfinite(arrays[name]) & (arrays[name] >= 0)):
                raise ValueError(f"{name}: must be finite numbers >= 0")
        elif name == "lora_targets":
            arrays[name] = _lora_targets(value)
        else:
            arr = np.asarray(value)
            if arr.dtype.kind not in "iub":
                if arr.dtype.kind == "f" and np.all(np.mod(arr, 1) == 0):
                    arr = arr.astype(np.int64)
                else:
                    raise ValueError(f"{name}: must be whole numbers")
            arrays[name] = arr.astype(np.int64)
    try:
        shape = np.broadcast_shapes(*(a.shape for a in arrays.values()))
    except ValueError:
        sizes = ", ".join(f"{k}={a.size}" for k, a in arrays.items() if a.size != 1)
        raise ValueError(
            f"grid: columns must have one length (or be scalars); got {sizes}"
        ) from None
    num_rows = int(np.prod(shape)) if shape else 1
    return {k: np.broadcast_to(v, shape).reshape(num_rows) for k, v in arrays.items()}


def _lora_targets(value: Any) -> np.ndarray:
    """Target bitmasks: ints pass through; strings ("q_proj,v_proj", "all-linear") encode."""
    arr = np.asarray(value)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    flat = [lora_mask(str(v)) for v in np.ravel(arr)]
    return np.array(flat, dtype=np.int64).reshape(arr.shape)


def grid_len(grid: Grid) -> int:
    return len(next(iter(grid.values())))
