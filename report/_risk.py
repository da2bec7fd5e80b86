"""The OOM risk of a job over a dataset's sequence lengths (`--lengths`, `--lengths-histogram`,
`--batching`, `--risk`): the options, the bounded readers of the files, and the `risk` block of
estimate's and fit's answers.

The probabilities are engine/_lengths.py's (its docstring states the epoch model); the step
peaks are one `estimate` call over every (step length, micro-batch rows) pair that the batching
makes of the distinct lengths, never a loop over steps.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from trainmem.engine import ModelSpec, Overheads, estimate, make_grid
from trainmem.engine._lengths import (
    BATCHINGS,
    bucket_of,
    clipped_histogram,
    default_buckets,
    epoch_no_oom_probability,
    max_length_pmf,
    monotone_peaks,
    quantile_of,
)
from trainmem.hardware._files import read_input_bytes, read_input_text, shown_path

from ._options import RISK_OPTIONS

LENGTH_COLUMNS = ("length", "lengths", "num_tokens", "token_count", "tokens", "n_tokens")
"""Column names read as the token counts (else a file's only column)."""
MAX_SEQUENCES = 1 << 40
"""Most sequences a histogram may count (beyond any dataset; keeps every count exact)."""
MAX_RISK_ROWS = 4_000_000
"""Most (length, rows) pairs one risk evaluation may estimate (about 2 s)."""

RISK_FIELDS = tuple(o.name for o in RISK_OPTIONS)


class Lengths(NamedTuple):
    """A dataset as a histogram: distinct token counts ascending and the sequences of each."""

    lengths: np.ndarray
    counts: np.ndarray
    source: str

    @property
    def num_sequences(self) -> int:
        return int(self.counts.sum())


def check_risk_options(
    lengths: Any, lengths_histogram: Any, *, batching: str, risk: float
) -> Lengths | None:
    """The dataset of the risk options, checked (ValueError, one line); None without one."""
    if batching not in BATCHINGS:
        raise ValueError(f"batching: unknown value '{batching}'; allowed: {', '.join(BATCHINGS)}")
    if not (isinstance(risk, (int, float)) and 0 <= risk <= 1):
        raise ValueError(f"risk: must be a probability in [0, 1], got {risk}")
    return dataset_lengths(lengths, lengths_histogram)


# ---- reading ------------------------------------------------------------------------------------


def dataset_lengths(
    lengths: str | Sequence[int] | None, lengths_histogram: str | Sequence[Any] | None
) -> Lengths | None:
    """The dataset of `--lengths` (a file, or inline counts) or `--lengths-histogram` (a file,
    or inline [length, count] pairs); None when neither is given. ValueError (one line)."""
    if lengths is not None and lengths_histogram is not None:
        raise ValueError("lengths: give --lengths or --lengths-histogram, not both")
    if lengths is not None:
        if isinstance(lengths, (str, os.PathLike)):
            counts = _column(_read_table(lengths, "lengths"), "lengths", lengths)
            return _histogram(counts, None, "lengths", shown_path(lengths))
        return _histogram(lengths, None, "lengths", "inline")
    if lengths_histogram is not None:
        if isinstance(lengths_histogram, (str, os.PathLike)):
            table = _read_table(lengths_histogram, "lengths_histogram")
            values, counts = _pairs(table, lengths_histogram)
            return _histogram(values, counts, "lengths_histogram", shown_path(lengths_histogram))
        pairs = list(lengths_histogram)
        if not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
            raise ValueError("lengths_histogram: expected [length, count] pairs")
        return _histogram(
            [p[0] for p in pairs], [p[1] for p in pairs], "lengths_histogram", "inline"
        )
    return None


def _read_table(path: str | os.PathLike[str], what: str) -> dict[str, list[Any]]:
    """A file's columns by name: Parquet (by its magic bytes or .parquet), CSV, or JSON (a
    list of numbers: column `length`; a list of pairs: `length`, `count`; a list of objects;
    an object of lists). Read through the bounded reader (hardware/_files.py)."""
    head = f"{what}: {shown_path(path)}"
    if str(path).endswith(".parquet"):
        return _parquet(path, what, head)
    text = read_input_text(path, what=what)
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{head}: not JSON ({error.msg}, line {error.lineno})") from None
        return _json_table(data, head)
    rows = list(csv.reader(io.StringIO(text)))
    rows = [r for r in rows if r and any(c.strip() for c in r)]
    if not rows:
        raise ValueError(f"{head}: empty file; expected a column of token counts")
    header = [c.strip() for c in rows[0]]
    if all(_is_number(c) for c in header):  # no header: the first column, and a second
        header, body = ["length", "count"][: len(header)] + header[2:], rows
    else:
        body = rows[1:]
    return {name: [r[i] if i < len(r) else "" for r in body] for i, name in enumerate(header)}


def _parquet(path: str | os.PathLike[str], what: str, head: str) -> dict[str, list[Any]]:
    data = read_input_bytes(path, what=what)
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(io.BytesIO(data))
    except Exception as error:  # pyarrow's errors are many classes
        raise ValueError(
            f"{head}: not a Parquet file ({' '.join(str(error).split())[:80]})"
        ) from None
    return {name: table.column(name).to_pylist() for name in table.column_names}


def _json_table(data: Any, head: str) -> dict[str, list[Any]]:
    if isinstance(data, dict):
        if all(isinstance(v, list) for v in data.values()) and data:
            return {str(k): v for k, v in data.items()}
        raise ValueError(f"{head}: expected a list of token counts or an object of columns")
    if not isinstance(data, list):
        raise ValueError(f"{head}: expected a list of token counts")
    if data and all(isinstance(x, dict) for x in data):
        names = list(dict.fromkeys(k for x in data for k in x))
        return {k: [x.get(k) for x in data] for k in names}
    if data and all(isinstance(x, list) for x in data):
        if not all(len(x) == 2 for x in data):
            raise ValueError(f"{head}: expected [length, count] pairs")
        return {"length": [x[0] for x in data], "count": [x[1] for x in data]}
    return {"length": data}


def _column(table: Mapping[str, list[Any]], what: str, path: Any) -> list[Any]:
    """The token counts: the first of LENGTH_COLUMNS present, else the only column."""
    for name in LENGTH_COLUMNS:
        if name in table:
            return table[name]
    if len(table) == 1:
        return next(iter(table.values()))
    raise ValueError(
        f"{what}: {shown_path(path)}: no column of token counts; name one of "
        f"{', '.join(LENGTH_COLUMNS)} (columns: {', '.join(list(table)[:8])})"
    )


def _pairs(table: Mapping[str, list[Any]], path: Any) -> tuple[list[Any], list[Any]]:
    if "count" not in table:
        raise ValueError(
            f"lengths_histogram: {shown_path(path)}: expected columns length,count "
            f"(columns: {', '.join(list(table)[:8])})"
        )
    return _column({k: v for k, v in table.items() if k != "count"}, "lengths_histogram", path), (
        table["count"]
    )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _whole(values: Sequence[Any], what: str, source: str, name: str, *, low: int) -> np.ndarray:
    """`values` as int64, each a whole number >= low (ValueError naming the first bad one)."""
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):  # the file's cells, read once (not configurations)
        try:
            number = float(v.strip() if isinstance(v, str) else v)
            bad = isinstance(v, bool) or not (number == int(number) and low <= number < 2**62)
        except (TypeError, ValueError, OverflowError):
            bad = True
        if bad:
            raise ValueError(
                f"{what}: {source}: {name} {i + 1} is {str(v)[:40]!r}; expected a whole "
                f"number >= {low}"
            )
        out[i] = int(number)
    return out


def _histogram(values: Any, counts: Any, what: str, source: str) -> Lengths:
    values = _whole(list(values), what, source, "entry", low=1)
    if not len(values):
        raise ValueError(f"{what}: {source}: no sequences; expected at least one token count")
    counts = (
        np.ones(len(values), dtype=np.int64)
        if counts is None
        else _whole(list(counts), what, source, "count", low=0)
    )
    if len(counts) != len(values):
        raise ValueError(f"{what}: {source}: lengths and counts differ in number")
    total = int(counts.sum(dtype=np.float64))
    if total < 1 or total > MAX_SEQUENCES:
        raise ValueError(f"{what}: {source}: {total} sequences; expected 1 to {MAX_SEQUENCES}")
    distinct, inverse = np.unique(values, return_inverse=True)
    return Lengths(distinct, np.bincount(inverse, weights=counts).astype(np.int64), source)


def bucket_bounds(buckets: str | None, seq_len: int) -> np.ndarray:
    """`--buckets` as ascending upper bounds ending at seq_len (bounds past it dropped)."""
    if buckets is None:
        return default_buckets(seq_len)
    items = [b.strip() for b in str(buckets).split(",") if b.strip()]
    if not items or not all(b.isdigit() and int(b) >= 1 for b in items):
        raise ValueError(
            f"buckets: expected comma-separated whole numbers >= 1 (token bounds), got {buckets!r}"
        )
    bounds = np.array(sorted({int(b) for b in items}), dtype=np.int64)
    return np.unique(np.append(bounds[bounds < seq_len], seq_len))


# ---- the steps of an epoch ----------------------------------------------------------------------


class Steps(NamedTuple):
    """The micro-batch shapes of an epoch, per candidate micro-batch b (a row each):
    `length[k]`, `rows[c, k]` and how many such micro-batches there are (`weight[c, k]`, may
    be fractional: pad-longest's expected count)."""

    length: np.ndarray
    rows: np.ndarray
    weight: np.ndarray


def risk_answers(
    spec: ModelSpec,
    config: Mapping[str, Any],
    data: Lengths,
    *,
    batching: str,
    buckets: str | None,
    risk: float,
    micro_batches: np.ndarray,
    usable_bytes: float,
    headroom: float,
    overheads: Overheads,
) -> list[dict[str, Any]]:
    """The `risk` block of each candidate micro-batch (one estimate over every step shape)."""
    seq_len = int(config["seq_len"])
    cp = max(int(config.get("cp", 1)), 1)
    values, counts = clipped_histogram(data.lengths, data.counts, seq_len=seq_len, multiple=cp)
    num = int(counts.sum())
    b = np.asarray(micro_batches, dtype=np.int64)
    if batching == "packed":
        tokens = float(np.sum(values.astype(np.float64) * counts))
        num_rows = int(np.ceil(tokens / seq_len))
        values, counts = np.array([seq_len]), np.array([num_rows])  # rows as the sequences
        num = num_rows
    # The last micro-batch (N mod b sequences) is taken at b rows: an upper bound (its peak is
    # nondecreasing in rows) that keeps the probability monotone in b (engine/_lengths.py).
    last = np.zeros_like(b)
    full = np.minimum(b, num)
    if batching == "bucketed":
        bounds = bucket_bounds(buckets, seq_len)
        per_bucket = np.bincount(
            bucket_of(values, bounds), weights=counts, minlength=len(bounds)
        ).astype(np.int64)
        lengths_eval = -(-bounds // cp) * cp  # padded to the bound (a multiple of cp)
        num_full = per_bucket[None, :] // b[:, None]  # [candidates, buckets]
        rem = per_bucket[None, :] % b[:, None]
        rows_eval = np.unique(b)
    else:
        lengths_eval = values
        rows_eval = np.unique(np.concatenate([full, last[last > 0]]))
    peaks = _peaks(spec, config, lengths_eval, rows_eval, usable_bytes, headroom, overheads)
    limit = usable_bytes * (1.0 - headroom)

    def at(rows: np.ndarray) -> np.ndarray:
        """Peaks at `rows` (per candidate, or per candidate and bucket) by length."""
        k = np.searchsorted(rows_eval, np.maximum(rows, rows_eval[0]))
        return (
            peaks.peak[k]
            if rows.ndim == 1
            else np.take_along_axis(peaks.peak[k], np.arange(len(lengths_eval))[None, :, None], 2)[
                ..., 0
            ]
        )

    max_len: list[int | None] | None = None
    if batching == "bucketed":
        b_peak = at(b)
        rem_peak = b_peak  # a bucket's last micro-batch at b rows, as pad-longest's
        exceeds = ((num_full > 0) & (b_peak > limit)) | ((rem > 0) & (rem_peak > limit))
        p_epoch: Any = exceeds.any(axis=1)
        steps_w = np.concatenate([num_full, (rem > 0)], axis=1).astype(np.float64)
        steps_p = np.concatenate([b_peak, np.where(rem > 0, rem_peak, 0.0)], axis=1)
        p_step = (steps_w * (steps_p > limit)).sum(1) / np.maximum(steps_w.sum(1), 1)
        worst = np.where(steps_w > 0, steps_p, 0.0).max(axis=1)
    else:  # pad-longest; packed: its rows of seq_len as the sequences
        peak_full = at(full)
        peak_last = np.where((last > 0)[:, None], at(last), 0.0)
        bad_full = ((peak_full > limit) * counts[None, :]).sum(axis=1)
        bad_last = ((peak_last > limit) * counts[None, :]).sum(axis=1)
        p_epoch = 1.0 - epoch_no_oom_probability(bad_full, bad_last, num, last)
        steps_w = max_length_pmf(counts, full)  # [candidates, lengths]
        steps_p = peak_full
        p_step = (steps_w * (peak_full > limit)).sum(axis=1)
        worst = peak_full[:, -1]
        if batching == "pad-longest":
            max_len = _max_length(values, counts, peak_full > limit, peak_last > limit, last, risk)
    p_epoch = np.asarray(p_epoch, dtype=np.float64).reshape(len(b))
    answers_out = []
    for c in range(len(b)):  # the candidates' blocks (a few numbers each), not the steps
        w, p = steps_w[c], steps_p[c]
        answers_out.append(
            {
                "batching": batching,
                "oom_probability": float(p_epoch[c]),
                "within_risk": bool(p_epoch[c] <= risk),
                "risk": risk,
                "worst_step_peak_device_bytes": int(round(float(worst[c]))),
                "step_peak_quantiles": {
                    "p50": int(round(quantile_of(p, w, 0.50))),
                    "p99": int(round(quantile_of(p, w, 0.99))),
                    "max": int(round(float(worst[c]))),
                },
                "step_oom_probability": float(p_step[c]),
                "limit_bytes": int(round(limit)),
                "num_sequences": data.num_sequences,
                "num_micro_batches": int(-(-num // int(b[c]))),
                "longest_sequence": int(data.lengths[-1]),
                "truncated_sequences": int(data.counts[data.lengths > seq_len].sum()),
                "max_seq_len_within_risk": None if max_len is None else max_len[c],
                "source": data.source,
            }
        )
    return answers_out


def _max_length(
    values: np.ndarray,
    counts: np.ndarray,
    bad_full: np.ndarray,
    bad_last: np.ndarray,
    last: np.ndarray,
    risk: float,
) -> list[int | None]:
    """pad-longest: per candidate, the largest truncation length among the dataset's distinct
    lengths (and seq_len) whose epoch stays within `risk` (None: not even the shortest).
    Truncating at L makes every longer sequence L long, so the bad sequences of a micro-batch
    are those <= L that are bad plus, when L itself is bad, every longer one."""
    num = int(counts.sum())
    below = np.cumsum(bad_full * counts, axis=1)  # bad sequences of length <= L
    above = num - np.cumsum(counts)  # sequences longer than L
    m_full = below + bad_full * above
    m_last = np.cumsum(bad_last * counts, axis=1) + bad_last * above
    ok = (
        1.0 - epoch_no_oom_probability(m_full, m_last, num, last[:, None]) <= risk
    )  # nondecreasing risk in L: the last True is the answer
    out: list[int | None] = []
    for row in ok:  # a few candidates' answers
        k = np.flatnonzero(row)
        out.append(int(values[k[-1]]) if len(k) else None)
    return out


class _Peaks(NamedTuple):
    peak: np.ndarray
    """[rows values, lengths] step peaks (device bytes), nondecreasing in length."""


def _peaks(
    spec: ModelSpec,
    config: Mapping[str, Any],
    lengths: np.ndarray,
    rows: np.ndarray,
    usable_bytes: float,
    headroom: float,
    overheads: Overheads,
) -> _Peaks:
    """The step peak of every (rows, length) pair: one estimate over their grid. Micro-batches
    of fewer rows keep the job's gradient accumulation (global batch scaled with the rows)."""
    num = len(rows) * len(lengths)
    if num > MAX_RISK_ROWS:
        raise ValueError(
            f"lengths: {len(lengths)} distinct lengths x {len(rows)} micro-batch sizes is "
            f"{num:,} estimates (limit {MAX_RISK_ROWS:,}); lower --max-micro-batch-size or "
            "--seq-len"
        )
    r = np.repeat(rows, len(lengths))
    s = np.tile(lengths, len(rows))
    columns = {**config, "micro_batch_size": r, "seq_len": s}
    gbs = int(config.get("global_batch_size", 0) or 0)
    if gbs:
        mb = max(int(config["micro_batch_size"]), 1)
        columns["global_batch_size"] = np.maximum(gbs // mb, 1) * r
    out = estimate(
        spec,
        make_grid(columns),
        usable_bytes=usable_bytes,
        headroom=headroom,
        overheads=overheads,
    )
    peak = out["peak_device_bytes"].reshape(len(rows), len(lengths))
    invalid = (out["reason"] != 0).reshape(len(rows), len(lengths))
    return _Peaks(monotone_peaks(np.where(invalid, np.inf, peak)))


CONTRACT_KEYS = ("oom_probability", "worst_step_peak_device_bytes", "step_peak_quantiles")
"""Issue 28's JSON keys: at the top level of estimate's and fit's answers (CLI --json and
HTTP) with a dataset, besides the `risk` block that holds them and more; absent without one
(as the `risk` block)."""


def risk_keys(block: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level contract keys (CONTRACT_KEYS) and the `risk` block of an answer."""
    return {**{k: block[k] for k in CONTRACT_KEYS}, "risk": dict(block)}


def risk_line(risk: Mapping[str, Any]) -> str:
    """The `risk` block in one line of estimate's table."""
    gib = float(1 << 30)
    q = risk["step_peak_quantiles"]
    return (
        f"  over {risk['source']} ({risk['num_sequences']:,} sequences, {risk['batching']}): "
        f"step peak p50 {q['p50'] / gib:.2f}, p99 {q['p99'] / gib:.2f}, worst "
        f"{risk['worst_step_peak_device_bytes'] / gib:.2f} GiB; {risk['step_oom_probability']:.2%} "
        f"of micro-batches exceed {risk['limit_bytes'] / gib:.2f} GiB; OOM probability of an "
        f"epoch {risk['oom_probability']:g} ({'within' if risk['within_risk'] else 'over'} "
        f"risk {risk['risk']:g})"
    )
