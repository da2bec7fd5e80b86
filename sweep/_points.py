"""What both searches share: the objectives, a search's result, the points frame, the ranking.

The exhaustive search (`_exhaustive`) and the Optuna one (`_optuna`) turn evaluated columns into
the points table's frame and rank fitting points the same way (`_best_of`, `_pareto`), so that
the two report their best points alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from trainmem.results import points_frame

from ._space import _NAMES, ALL_REASONS, AXES, Space

OBJECTIVES = {
    "cost": "cost_per_million_tokens",
    "time": "step_time_s",
    "gpus": "num_gpus",
}
"""Objective name -> the column minimized (ties broken by cost, then step time)."""
TIE_BREAK = ("cost_per_million_tokens", "step_time_s", "num_gpus")
TOP = 10
PROCESS_START = time.time()
"""Temporary files without an owner in their name and older than this are a dead run's."""

Progress = Callable[[int, int], None]
"""progress(points_done, points_total)."""


@dataclass(slots=True, kw_only=True)
class SearchResult:
    """What a search found: the best point(s) and where the points are."""

    best: list[dict[str, Any]]
    """The optimum (one row), or the Pareto front (several objectives), fitting points only."""
    top: pl.DataFrame
    """Up to ten best fitting points, best first."""
    num_points: int
    """Points evaluated (and stored) by this study so far."""
    parquet: str
    """The study's folder of Parquet parts."""
    elapsed_s: float
    """Wall time of this call."""
    extra: dict[str, Any] = field(default_factory=dict)


def parse_objectives(text: str) -> tuple[str, ...]:
    """Objective names from comma-separated text (several: a Pareto front); ValueError naming
    the first unknown one."""
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [n for n in names if n not in OBJECTIVES]
    if not names or bad:
        raise ValueError(
            f"objective: unknown value '{(bad or [text])[0]}'; allowed: {', '.join(OBJECTIVES)} "
            "(comma-separated for a Pareto front)"
        )
    if len(names) > 2:
        raise ValueError(f"objective: at most two objectives for a Pareto front, got '{text}'")
    twice = [n for i, n in enumerate(names) if n in names[:i]]
    if twice:
        raise ValueError(
            f"objective: '{twice[0]}' given twice in '{text}'; allowed: each of "
            f"{', '.join(OBJECTIVES)} once"
        )
    return names


def _names(vocab: Sequence[str], codes: np.ndarray) -> pl.Series:
    """Names from codes, a categorical gathered in polars: no Python object nor string per
    row, and the part is written from the codes (no string hashed per row)."""
    names = pl.Series(list(vocab), dtype=pl.Categorical)
    return names.gather(np.asarray(codes, dtype=np.int64))


def _frame(
    space: Space, res: dict[str, np.ndarray], *, study: str, trial: Any = None
) -> pl.DataFrame:
    cols: dict[str, Any] = {
        **{k: v for k, v in res.items() if k not in space.labels},
        "gpu": _names([p.gpu for p in space.fleet.pools], res["pool"]),
        **{a: _names(vocab, res[a]) for a, vocab in _NAMES.items()},
        "reason": _names(ALL_REASONS, res["reason"]),
        **{k: v for k, v in space.labels.items() if k not in res},
        "model": space.model.name,
        "study": study,
    }
    if trial is not None:
        cols["trial"] = trial
    return points_frame(cols)


def _sort_keys(objectives: Sequence[str]) -> list[str]:
    keys = [OBJECTIVES[o] for o in objectives]
    return keys + [k for k in TIE_BREAK if k not in keys]


def _pareto(frame: pl.DataFrame, objectives: Sequence[str]) -> pl.DataFrame:
    """Non-dominated fitting rows for two objectives (sort by the first, running min of the
    second), one row per distinct objective pair."""
    keys = [OBJECTIVES[o] for o in objectives]
    if len(keys) == 1:
        return frame.sort(_sort_keys(objectives), maintain_order=True).head(1)
    if len(keys) != 2:
        raise ValueError("objective: at most two objectives for a Pareto front")
    f = frame.sort([*keys, *[k for k in TIE_BREAK if k not in keys]], maintain_order=True)
    f = f.unique(subset=keys, keep="first", maintain_order=True)
    second = f[keys[1]].to_numpy()
    prev_min = np.minimum.accumulate(np.concatenate([[np.inf], second[:-1]]))
    return f.filter(pl.Series(second < prev_min))


def _best_rows(frame: pl.DataFrame) -> list[dict[str, Any]]:
    return frame.to_dicts()


SAME_BUT_ZERO = (
    "gpu",
    *(axis for axis in AXES[1:] if axis != "zero"),
    "peak_device_bytes",
    "step_time_s",
    "cost_per_million_tokens",
)
"""Rows equal on these columns differ only in a ZeRO stage that changes nothing (its shard
group is one rank, or the stages agree): a table shows them once, the lowest stage."""
NUM_ZERO_STAGES = 4


def _best_of(
    frame: pl.DataFrame, *, keys: list[str], top: int | None, distinct: tuple[str, ...]
) -> pl.DataFrame:
    """The best rows by `keys`: one per distinct combination of `distinct`, rows that differ
    only in an ineffective ZeRO stage once (SAME_BUT_ZERO: the first, the lowest stage in the
    space's order), `top` at most."""
    frame = frame.sort(keys, maintain_order=True)
    if distinct:
        frame = frame.unique(subset=list(distinct), keep="first", maintain_order=True)
    if top is not None:  # each kept row stands for at most NUM_ZERO_STAGES equal rows
        frame = frame.head(top * NUM_ZERO_STAGES)
    frame = frame.unique(subset=list(SAME_BUT_ZERO), keep="first", maintain_order=True)
    return frame if top is None else frame.head(top)
