"""The per-row work of estimate() on a large grid as compiled loops over all cores (numba):
each row reads its terms from the per-key tables once and runs the per-row functions generated
from the engine's own definitions (engine/_fast/_rows.py: the layout rules, a stage's phase peaks,
the allocator's slack), without a temporary array per operation. This module is the loop's
skeleton only: which stage variant is the worst rank, and where each value goes.

This module imports numba: only engine/_fast/_kernel.py imports it, lazily. numpy's blocks in
engine/_estimate.py are the reference; the generated functions are their trace, so the results
agree to the bit (tests/unit/engine/test_kernel.py).

Every function compiles with nogil=True, cache=True (machine code kept on disk under
NUMBA_CACHE_DIR, which engine/_fast/_kernel.py sets to trainmem's cache folder unless it is set: not
next to this file, inside site-packages) and error_model="numpy" (a division by
zero gives inf/NaN, as numpy's does), and without fastmath: IEEE operations in source order, as
numpy does them (no contraction to FMA, no reassociation).
"""

from __future__ import annotations

import numba
import numpy as np

from .._estimate import _A_TERMS, _S_TERMS
from .._peaks import STAGE_PEAKS
from . import _rows

rows = _rows.numba_module()
"""The generated per-row functions (engine/_fast/_rows.py): reason_rows (the layout rules over every
row), stage_peaks and fragmentation (one row's), compiled from engine/_rules.py and
engine/_peaks.py."""
_stage_peaks, _fragmentation = rows.stage_peaks, rows.fragmentation
ALLOCATED = STAGE_PEAKS.index("peak_allocated_bytes")
GRADS_AT_PEAK = STAGE_PEAKS.index("gradients")
S_PARAMETERS, S_MASTER_WEIGHTS, S_OPTIMIZER_STATES = (
    _S_TERMS.index(k) for k in ("parameters", "master_weights", "optimizer_states")
)
assert _A_TERMS  # the activation terms' order is the tables' (read by the generated functions)

OUT_COLUMNS = (
    *STAGE_PEAKS[:-1],
    "parameters",
    "master_weights",
    "optimizer_states",
    "fragmentation",
    "peak_reserved_bytes",
    "peak_device_bytes",
    "headroom_bytes",
)
"""The rows of assemble_rows' float output (peak_phase goes out as int8 on its own)."""
NUM_OUT = len(OUT_COLUMNS)
_NUM_PEAKS = len(STAGE_PEAKS) - 1
(O_PARAMETERS, O_MASTER, O_OPTIMIZER_STATES, O_FRAGMENTATION, O_RESERVED, O_DEVICE, O_HEADROOM) = (
    range(_NUM_PEAKS, NUM_OUT)
)


GATHER_ROWS = 2048
"""Rows per block of assemble_rows: each block first copies its rows' terms out of the per-key
tables (a tight loop, whose cache misses overlap), then assembles them from that copy."""


@numba.njit(nogil=True, cache=True)
def _gather(table, keys, lo, hi):
    """The rows keys[lo:hi] of a keys x terms table, as one contiguous block."""
    out = np.empty((hi - lo, table.shape[1]))
    for i in range(lo, hi):
        row = table[keys[i]]
        for t in range(table.shape[1]):
            out[i - lo, t] = row[t]
    return out


@numba.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def assemble_rows(
    tables, keys, stages, two_variants, gather, layout, rows, consts, extra_terms, outs, flags
):
    """Every row's columns, into `outs`: (the float columns per OUT_COLUMNS, the extra terms)
    and `flags` (int8 rows: the peak phase, the stage variant chosen, the fit 0/1).

    tables: the state and activation tables (keys x terms, C order: a key's terms share cache
    lines) of the first stage variant, then of the last (read where `two_variants` and pp > 1:
    the worst rank is the one with the larger allocated peak, the first on a tie); keys: each
    row's state and activation key; stages: each row's stage in the two variants; `gather`:
    copy each block's rows out of the tables first (large tables, read in random order: the
    copy's misses overlap, the assembly's would not); layout: the STAGE_COLUMNS
    (engine/_peaks.py, int64); rows: micro-batches per step, expandable segments (0/1), bytes
    outside torch, the usable limit, the layout reason; consts: cuBLAS workspace,
    fragmentation fraction (native, expandable), largest-block factor; extra_terms: state and
    activation terms to copy out of the chosen variant's tables (state terms first).
    """
    n = len(keys[0])
    for block in numba.prange((n + GATHER_ROWS - 1) // GATHER_ROWS):
        lo, hi = block * GATHER_ROWS, min(n, (block + 1) * GATHER_ROWS)
        terms = tables
        if gather:
            s0, a0 = _gather(tables[0], keys[0], lo, hi), _gather(tables[1], keys[1], lo, hi)
            s1 = _gather(tables[2], keys[0], lo, hi) if two_variants else s0
            a1 = _gather(tables[3], keys[1], lo, hi) if two_variants else a0
            terms = (s0, a0, s1, a1)
        _assemble_block(
            terms, gather, lo, hi, keys, stages, two_variants, layout, rows, consts, extra_terms,
            outs, flags,
        )  # fmt: skip


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _assemble_block(
    tables,
    by_row,
    lo,
    hi,
    keys,
    stages,
    two_variants,
    layout,
    rows,
    consts,
    extra_terms,
    outs,
    flags,
):
    """Rows lo..hi of assemble_rows; `tables` hold their terms by key, or `by_row` (gathered:
    row i at i - lo)."""
    s0, a0, s1, a1 = tables
    num_micro, expandable, outside_torch, limit, reason = rows
    extra_s, extra_a = extra_terms
    out, extra = outs
    for i in range(lo, hi):
        ks = i - lo if by_row else keys[0][i]
        ka = i - lo if by_row else keys[1][i]
        r = _stage_peaks(s0[ks], a0[ka], layout, i, stages[0][i], num_micro[i])
        chosen = 0
        if two_variants and layout[0][i] > 1:  # pp > 1: the last stage may be the worst
            last = _stage_peaks(s1[ks], a1[ka], layout, i, stages[1][i], num_micro[i])
            if last[ALLOCATED] > r[ALLOCATED]:
                r = last
                chosen = 1
        s = s1[ks] if chosen else s0[ks]
        a = a1[ka] if chosen else a0[ka]
        held = (r[ALLOCATED], r[GRADS_AT_PEAK])
        slack = _fragmentation(s, a, *held, expandable[i] > 0, consts)[0]
        reserved = r[ALLOCATED] + consts[0] + slack
        device = reserved + outside_torch[i]
        for j in range(_NUM_PEAKS):
            out[j, i] = r[j]
        out[O_PARAMETERS, i] = s[S_PARAMETERS]
        out[O_MASTER, i] = s[S_MASTER_WEIGHTS]
        out[O_OPTIMIZER_STATES, i] = s[S_OPTIMIZER_STATES]
        out[O_FRAGMENTATION, i] = slack
        out[O_RESERVED, i] = reserved
        out[O_DEVICE, i] = device
        out[O_HEADROOM, i] = limit[i] - device
        for j in range(len(extra_s)):
            extra[j, i] = s[extra_s[j]]
        for j in range(len(extra_a)):
            extra[len(extra_s) + j, i] = a[extra_a[j]]
        flags[0, i] = int(r[_NUM_PEAKS])
        flags[1, i] = chosen
        flags[2, i] = 1 if (device <= limit[i]) and reason[i] == 0 else 0
