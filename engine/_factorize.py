"""Evaluate expensive per-row terms once per distinct key, then gather them back to the rows.

Model states depend on a handful of low-cardinality columns (tp, pp, dp, zero, precision,
optimizer, framework, stage); activations on a few others. A sweep grid repeats each combination
many times, so the per-tensor work runs on the distinct combinations only. This is still one
vectorized pass: no Python loop over rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

_DENSE_LIMIT = 1 << 22
"""Largest key space factorized with a dense table (else numpy's sort-based unique)."""
_NARROW = 256
"""Integer columns spanning fewer values than this are coded as value - min (no gather)."""


def _dense_codes(col: np.ndarray) -> tuple[np.ndarray, int]:
    """Codes 0..k-1 for a column's distinct values (order-preserving), and k."""
    col = np.asarray(col)
    if col.dtype == bool:
        return col.astype(np.int64), 2
    if col.dtype.kind in "iu" and col.size:
        lo, hi = int(col.min()), int(col.max())
        if hi - lo < _DENSE_LIMIT:
            offset = col - lo
            present = np.zeros(hi - lo + 1, dtype=bool)
            present[offset] = True
            distinct = np.flatnonzero(present)  # sorted: the codes keep the values' order
            lut = np.empty(hi - lo + 1, dtype=np.int32)  # only present entries are read
            lut[distinct] = np.arange(len(distinct), dtype=np.int32)
            return lut[offset], len(distinct)
    uniq, inv = np.unique(col, return_inverse=True)
    return inv.reshape(-1), len(uniq)


def _column_codes(col: np.ndarray) -> tuple[np.ndarray | None, int]:
    """Codes 0..width-1 of one key column and `width`; (None, 1) for a constant column.

    Integer and bool columns whose values span a narrow range code as value - min (no gather);
    wider or float columns are coded densely (order-preserving), so the packed key stays small.
    """
    col = np.asarray(col)
    if col.size == 0 or (col.ndim == 1 and col.strides[0] == 0):  # a broadcast scalar
        return None, 1
    if col.dtype == bool:
        col = col.view(np.uint8)
    if col.dtype.kind in "iu":
        lo, hi = int(col.min()), int(col.max())
        if lo == hi:
            return None, 1
        if hi - lo < _NARROW:
            return (col.astype(np.int64) - lo if lo else col), hi - lo + 1
    elif col.dtype.kind == "f" and col.min() == col.max():
        return None, 1
    return _dense_codes(col)


def factorize(columns: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(inverse, representatives): row -> distinct-key index, and one row index per key.

    Constant columns are skipped; the others are packed into one int64 key by their codes
    (`_column_codes`: two reductions each, a gather only for wide columns, no sort), compressed
    when the key space grows large; the packed key is then coded densely once.
    """
    n = len(columns[0])
    key: np.ndarray | None = None
    space = 1
    for col in columns:
        codes, width = _column_codes(col)
        if codes is None:
            continue
        if space * width >= _DENSE_LIMIT:  # compress before the key space grows too large
            assert key is not None
            key, space = _dense_codes(key)
        key = codes.astype(np.int64) if key is None else key * width + codes
        space *= width
    if key is None:  # every column constant: one key (or none for no rows)
        return np.zeros(n, dtype=np.int64), np.zeros(min(n, 1), dtype=np.int64)
    inverse, num_keys = _dense_codes(key)
    representatives = np.empty(num_keys, dtype=np.int64)
    representatives[inverse] = np.arange(n)
    return inverse, representatives


def per_key(
    fn: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
    columns: dict[str, np.ndarray],
    key_fields: Sequence[str],
) -> dict[str, np.ndarray]:
    """Run `fn` on the distinct combinations of `key_fields` and broadcast back to every row.

    `fn` receives the columns restricted to one representative row per combination; it must
    depend only on `key_fields` (and on values that are functions of them).
    """
    n = len(columns[key_fields[0]])
    inverse, reps = factorize([columns[k] for k in key_fields])
    if len(reps) == n:  # nothing repeats: evaluate in place
        return {k: np.broadcast_to(v, (n,)) for k, v in fn(columns).items()}
    sub = {k: columns[k][reps] for k in key_fields}
    out = fn(sub)
    return {k: np.broadcast_to(v, (len(reps),))[inverse] for k, v in out.items()}
