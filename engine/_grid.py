"""The columnar grid: one numpy array per training field, one row per configuration.

Categorical fields are stored as small integer codes (index into the vocabulary tuples below), so
the estimator is pure array arithmetic. A single configuration is a grid of one row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._config import DEFAULTS_BY_FIELD, KNOBS, TYPES, grid_columns
from ._states import lora_mask
from ._vocab import (  # noqa: F401 (re-exported by the engine package)
    ALLOCATORS,
    ATTENTION,
    COMPILES,
    FRAMEWORKS,
    LOADS,
    LOSSES,
    OFFLOADS,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
)

CATEGORICAL: dict[str, tuple[str, ...]] = {
    (knob.grid or name): OPTIMIZERS if knob.open_choices else tuple(knob.choices or ())
    for name, knob in KNOBS.items()
    if knob.choices is not None or knob.open_choices
}
"""The grid's categorical columns and their vocabularies (a code is an index), from the
training fields' declarations (engine/_config.py): a knob declared with `choices` is one,
with no other edit (an open vocabulary, the optimizer's, holds the built-in names)."""

OPTIMIZER_COLUMNS: dict[str, Any] = {
    "optimizer_custom": False,
    "optimizer_num_states": 0.0,
    "optimizer_state_bytes": 0.0,
    "optimizer_temp_states": 0.0,
    "optimizer_eight_bit": False,
    "optimizer_step_bytes": 0.0,
}
"""A user optimizer (a TOML file, see _optimizers.py) as grid columns; they apply only where
`optimizer_custom` is true."""

DEFAULTS: dict[str, Any] = {**grid_columns(DEFAULTS_BY_FIELD), **OPTIMIZER_COLUMNS}
"""Every grid field and its default: the training configuration's fields (engine/_config.py)
as grid columns, then the user-optimizer columns. `global_batch_size` 0 means
micro_batch_size x dp (no gradient accumulation)."""

FLOAT_FIELDS = tuple(k for k, v in DEFAULTS.items() if isinstance(v, float))
"""Float columns: the user-optimizer amounts and the float training fields (the RL rollout's
gpu_memory_utilization; capacity_factor is stored as an integer percent)."""
BOOL_FIELDS = (
    *(k for k, t in TYPES.items() if t is bool),
    *(k for k, v in OPTIMIZER_COLUMNS.items() if isinstance(v, bool)),
)
INT_FIELDS = tuple(k for k, v in DEFAULTS.items() if isinstance(v, int) and not isinstance(v, bool))

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
