"""A sweep's risk over a dataset (`--lengths`, `--batching`, `--risk`) as a constraint: every
valid point's epoch OOM probability, worst step and step-peak quantiles, columns over the grid.

The epoch model and its probabilities are engine/_lengths.py's, the answer `estimate --lengths`
gives for one point (report/_risk.py). A point's step-peak distribution needs the peak at each
distinct length; under that model's assumption (the peak is nondecreasing in length) the
weighted q-quantile of the peak is the peak at the q-quantile of the step's length (a quantile
commutes with a nondecreasing map), and the worst step is the peak at the longest step length
(pad-longest: the longest clipped sequence; bucketed: the largest bucket used; packed: seq_len).
So each point needs the engine at three lengths (p50, p99, longest; one for packed), never at
every distinct length: the grid is evaluated again at 3 rows per valid point (about 3x the
sweep's memory estimate; time and cost are not re-estimated). The answers equal estimate's
exactly where the engine's peak is nondecreasing in length; where it is not, estimate's running
maximum over every distinct length can be higher (not seen on the shipped models).

The epoch's OOM probability is 1 or 0 in this model (every sequence is seen once an epoch, and
the last micro-batch is taken at b rows): 1 where the worst step exceeds the limit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainmem.engine._lengths import (
    BATCHINGS,
    bucket_of,
    clipped_histogram,
    max_length_pmf,
    monotone_peaks,
)

RISK_COLUMNS = (
    "oom_probability",
    "worst_step_peak_device_bytes",
    "step_peak_p50_device_bytes",
    "step_peak_p99_device_bytes",
)
"""The points table's risk columns (null without a dataset, and on invalid points); the
step peak's max is `worst_step_peak_device_bytes`."""
QUANTILES = (0.50, 0.99)


@dataclass(frozen=True, slots=True, kw_only=True)
class SpaceRisk:
    """A sweep's dataset and how it is batched: the constraint oom_probability <= risk."""

    lengths: np.ndarray
    """Distinct token counts, ascending."""
    counts: np.ndarray
    """Sequences of each length."""
    batching: str
    """One of engine/_lengths.py BATCHINGS."""
    bounds: np.ndarray | None
    """bucketed: the buckets' upper bounds ending at seq_len (report/_risk.py bucket_bounds)."""
    risk: float
    """The OOM probability per epoch a point may take."""
    source: str = "inline"

    def __post_init__(self) -> None:
        assert self.batching in BATCHINGS, self.batching

    def digest(self) -> str:
        """A short hash of everything that decides the risk columns (part names use it)."""
        h = hashlib.sha256()
        for a in (self.lengths, self.counts, self.bounds):
            h.update(b"-" if a is None else np.ascontiguousarray(a, dtype=np.int64).tobytes())
        h.update(f"{self.batching}|{self.risk!r}".encode())
        return h.hexdigest()[:10]


def step_lengths(
    risk: SpaceRisk, *, micro_batch: np.ndarray, cp: np.ndarray, seq_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """(rows [n], lengths [n, 3]) of each point's p50, p99 and worst micro-batch, grouped by
    the distinct (cp, micro-batch) pairs (a few axis values, not the points): the histogram
    each cp clips (`clipped_histogram`), each micro-batch's distribution of its step length
    (pad-longest: the longest of b sequences, `max_length_pmf`; bucketed: ceil(n_j / b)
    micro-batches per bucket j; packed: rows of seq_len), and its quantiles as
    report/_risk.py `quantile_of` takes them (the smallest length whose weight reaches q)."""
    b = np.asarray(micro_batch, dtype=np.int64)
    cps = np.maximum(np.asarray(cp, dtype=np.int64), 1)
    pairs, inverse = np.unique(np.stack([cps, b]), axis=1, return_inverse=True)
    rows = np.empty(pairs.shape[1], dtype=np.int64)
    out = np.empty((pairs.shape[1], len(QUANTILES) + 1), dtype=np.int64)
    for c in np.unique(pairs[0]):  # each context-parallel degree (a few)
        at = np.flatnonzero(pairs[0] == c)
        r, lengths = _for_cp(risk, int(c), pairs[1, at], seq_len)
        rows[at], out[at] = r, lengths
    inverse = inverse.reshape(-1)
    return rows[inverse], out[inverse]


def _for_cp(risk: SpaceRisk, cp: int, b: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    values, counts = clipped_histogram(risk.lengths, risk.counts, seq_len=seq_len, multiple=cp)
    num = int(counts.sum())
    if risk.batching == "packed":  # rows of seq_len, every step alike
        tokens = float(np.sum(values.astype(np.float64) * counts))
        rows = np.minimum(b, int(np.ceil(tokens / seq_len)))
        return rows, np.full((len(b), len(QUANTILES) + 1), seq_len, dtype=np.int64)
    if risk.batching == "bucketed":
        assert risk.bounds is not None
        bounds = risk.bounds
        per_bucket = np.bincount(bucket_of(values, bounds), weights=counts, minlength=len(bounds))
        weights = np.ceil(per_bucket[None, :] / b[:, None])  # micro-batches per bucket
        steps = -(-bounds // cp) * cp
        rows = b
    else:  # pad-longest
        rows = np.minimum(b, num)
        weights = max_length_pmf(counts, rows)
        steps = values
    cum = np.cumsum(weights, axis=1)
    picks = [
        np.minimum(np.sum(cum < (q * cum[:, -1:] * (1 - 1e-12)), axis=1), weights.shape[1] - 1)
        for q in QUANTILES
    ]
    used = weights.shape[1] - 1 - np.argmax((weights > 0)[:, ::-1], axis=1)  # the longest step
    return rows, np.stack([steps[k] for k in (*picks, used)], axis=1).astype(np.int64)


def risk_columns(
    risk: SpaceRisk, peaks: np.ndarray, limit_bytes: np.ndarray
) -> dict[str, np.ndarray]:
    """The risk columns from each point's peaks [n, 3] at its step_lengths (inf: invalid
    there), made nondecreasing (`monotone_peaks`, as estimate's): the worst step is the last,
    the epoch exceeds exactly where it does."""
    peaks = monotone_peaks(peaks)
    worst = peaks[:, -1]
    return {
        "oom_probability": (worst > limit_bytes).astype(np.float64),
        "worst_step_peak_device_bytes": worst,
        "step_peak_p50_device_bytes": peaks[:, 0],
        "step_peak_p99_device_bytes": peaks[:, 1],
    }


def null_columns(num: int) -> dict[str, np.ndarray]:
    """The risk columns of `num` points that have none (invalid points): NaN (stored null)."""
    return {name: np.full(num, np.nan) for name in RISK_COLUMNS}


def scatter(part: Mapping[str, np.ndarray], rows: np.ndarray, num: int) -> dict[str, Any]:
    """`part` (the columns of points `rows`) into columns of `num` points, NaN elsewhere."""
    cols = null_columns(num)
    for name, values in part.items():
        cols[name][rows] = values
    return cols


def space_risk(
    *,
    lengths: Any,
    lengths_histogram: Any,
    batching: str,
    buckets: str | None,
    risk: float,
    seq_len: int,
) -> SpaceRisk | None:
    """The risk options of a search, checked and read (report/_risk.py: one-line ValueError
    naming the field); None without a dataset (then --batching, --buckets and --risk only
    checked)."""
    from trainmem.report._risk import bucket_bounds, check_risk_options

    data = check_risk_options(lengths, lengths_histogram, batching=batching, risk=risk)
    bounds = bucket_bounds(buckets, seq_len) if batching == "bucketed" else None
    if data is None:
        return None
    return SpaceRisk(
        lengths=data.lengths,
        counts=data.counts,
        batching=batching,
        bounds=bounds,
        risk=float(risk),
        source=data.source,
    )


def risk_text(risk: SpaceRisk | None) -> str:
    """``-risk0.001-pad-longest-3f2a...``: what a default study name carries with a dataset
    (a sweep over another dataset or batching is another study)."""
    if risk is None:
        return ""
    return f"-risk{risk.risk:g}-{risk.batching}-{risk.digest()[:6]}"
