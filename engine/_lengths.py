"""The OOM risk of an epoch over a dataset of sequence lengths: which steps a batching makes of
the lengths, and the probability that one of them exceeds the device's limit.

Pure numpy over columns (the distinct lengths, the candidate micro-batches); the step peaks come
from one `estimate` call over the (length, rows) pairs these functions ask for (report/_risk.py).

The epoch (every batching): the N sequences once each, in a uniformly random order (a shuffled
sampler), cut into micro-batches of b, the last one holding the N mod b left over (a DataLoader's
drop_last=False), taken at b rows: an upper bound (the peak is nondecreasing in rows) that keeps
the probability monotone in b; the exact tail (`epoch_no_oom_probability` with last_rows > 0)
is not monotone (an odd-sized last micro-batch may hold the longest sequence and fit).
Every sequence is seen once an epoch, so the micro-batch holding the longest one comes for
certain: an epoch's OOM probability is 1 when that micro-batch exceeds and 0 otherwise. The
independent-steps estimate 1 - (1 - p)^num_steps (p: one micro-batch's probability) understates
it (1 - 1/e for a single over-long sequence); `step_oom_probability` is p itself, the fraction
of micro-batches that exceed. A data-parallel world shares the epoch's micro-batches between
its ranks, and an OOM on any rank ends the job, so the epoch's probability is over all of its
micro-batches whatever dp is. A sequence longer than seq_len is truncated to it (the tokenizer's
max_length).

Assumes the step peak is nondecreasing in the step's length and in its rows (the engine's is:
activations, logits and scores grow with tokens); the running maximum over lengths
(`monotone_peaks`) makes it so where a rounding says otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

BATCHINGS = ("pad-longest", "packed", "bucketed")
"""pad-longest: a micro-batch is padded to its longest sequence; packed: documents concatenated
and cut into rows of seq_len; bucketed: sequences grouped by length bucket, a micro-batch padded
to its bucket's upper bound."""


def clipped_histogram(
    lengths: np.ndarray, counts: np.ndarray, *, seq_len: int, multiple: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """(distinct step lengths ascending, sequences of each): every length truncated to seq_len
    and rounded up to a multiple of `multiple` (context parallel splits a sequence into cp
    equal parts: rule `seq_len must be divisible by cp`; the sampler pads to it)."""
    step = np.minimum(np.asarray(lengths, dtype=np.int64), seq_len)
    step = -(-step // multiple) * multiple
    values, inverse = np.unique(step, return_inverse=True)
    return values, np.bincount(inverse, weights=counts, minlength=len(values)).astype(np.int64)


def monotone_peaks(peaks: np.ndarray) -> np.ndarray:
    """Step peaks over ascending lengths (last axis) made nondecreasing: their running max."""
    return np.maximum.accumulate(np.asarray(peaks, dtype=np.float64), axis=-1)


_SMALL_FACTORIALS = 256
_LOG_FACTORIALS = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, _SMALL_FACTORIALS)))))


def log_factorial(n: np.ndarray) -> np.ndarray:
    """ln(n!) elementwise for whole n >= 0: a table below 256, Stirling's series above
    (n ln n - n + ln(2 pi n) / 2 + 1/(12n) - 1/(360n^3) + 1/(1260n^5); its next term is under
    1e-17 there). Source: Abramowitz & Stegun 6.1.41."""
    n = np.asarray(n, dtype=np.float64)
    small = _LOG_FACTORIALS[np.clip(n, 0, _SMALL_FACTORIALS - 1).astype(np.int64)]
    big = np.maximum(n, _SMALL_FACTORIALS)
    stirling = (
        big * np.log(big)
        - big
        + 0.5 * np.log(2 * np.pi * big)
        + 1 / (12 * big)
        - 1 / (360 * big**3)
        + 1 / (1260 * big**5)
    )
    return np.where(n < _SMALL_FACTORIALS, small, stirling)


def subset_ratio(good: Any, total: Any, k: Any) -> np.ndarray:
    """C(good, k) / C(total, k): the probability that k items drawn without replacement from
    `total` all lie among `good` of them (0 where good < k; 1 where k == 0), elementwise.

    Source: the hypergeometric distribution, P(X = k) with k successes in k draws:
    good! (total - k)! / ((good - k)! total!), in logs (log_factorial)."""
    good, total, k = np.broadcast_arrays(
        np.asarray(good, dtype=np.float64),
        np.asarray(total, dtype=np.float64),
        np.asarray(k, dtype=np.float64),
    )
    ok = good >= k
    logs = (
        log_factorial(good)
        - log_factorial(np.maximum(good - k, 0))
        + log_factorial(np.maximum(total - k, 0))
        - log_factorial(total)
    )
    return np.where(ok, np.exp(np.minimum(logs, 0.0)), 0.0)


def max_length_pmf(counts: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """P(the longest of a micro-batch of `rows` sequences has the k-th distinct length), for
    each row of `rows` (shape [len(rows), len(counts)]): the micro-batch is a uniformly random
    subset of the epoch (a shuffled epoch's micro-batch is one).

    Source: order statistics without replacement, P(max <= v_k) = C(K_k, b) / C(N, b) with K_k
    the sequences of length <= v_k; the pmf is its difference. Ignores nothing within the
    epoch model (the module's docstring)."""
    counts = np.asarray(counts, dtype=np.int64)
    num = int(counts.sum())
    rows = np.minimum(np.asarray(rows, dtype=np.int64), num)[:, None]
    cdf = subset_ratio(np.cumsum(counts)[None, :], num, rows)
    return np.diff(cdf, axis=-1, prepend=0.0)


def epoch_no_oom_probability(
    bad_full: np.ndarray, bad_last: np.ndarray, num_sequences: int, last_rows: np.ndarray
) -> np.ndarray:
    """P(no micro-batch of a pad-longest epoch exceeds), per candidate.

    bad_full: sequences whose micro-batch of b rows exceeds (its longest being that sequence,
    or longer: nondecreasing peaks); bad_last: those that also exceed in the last micro-batch of
    `last_rows` = N mod b rows (0: every micro-batch is full). The epoch is safe exactly when
    every bad_full sequence sits in the last micro-batch and none of them is bad there (it then
    holds no bad_last one: bad_last is within bad_full): C(r, m) / C(N, m) with r = last_rows,
    m = bad_full, and 0 when bad_last > 0.

    Source: a uniformly random permutation puts a given m-set inside the last r positions with
    probability C(r, m) / C(N, m) (hypergeometric)."""
    inside = subset_ratio(last_rows, num_sequences, bad_full)
    return np.where(np.asarray(bad_last) > 0, 0.0, inside)


def default_buckets(seq_len: int) -> np.ndarray:
    """Bucket upper bounds: the powers of two below seq_len, then seq_len (a length l goes to
    the first bound >= l). Source: the usual power-of-two bucketing (fairseq's
    `--batch-by-size` style buckets, tf.data bucket_by_sequence_length examples); a
    `--buckets` list replaces it."""
    powers = 2 ** np.arange(0, max(int(np.ceil(np.log2(max(seq_len, 1)))), 0) + 1)
    return np.unique(np.append(powers[powers < seq_len], seq_len)).astype(np.int64)


def bucket_of(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Each length's bucket: the index of the first upper bound >= it."""
    return np.searchsorted(bounds, values, side="left")


def quantile_of(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The weighted q-quantile of `values` (the smallest value whose cumulative weight reaches
    q of the total; the inverse of the empirical CDF)."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(np.asarray(weights, dtype=np.float64)[order])
    k = int(np.searchsorted(cum, q * cum[-1] * (1 - 1e-12), side="left"))
    return float(np.asarray(values)[order][min(k, len(order) - 1)])
