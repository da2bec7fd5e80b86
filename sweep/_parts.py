"""An exhaustive sweep's Parquet parts: which points a chunk stores (`--store`), the parts'
names, and their publication in batches (one fsync round per batch, not per part).

`--store` keeps the table smaller; the points it leaves out are the space's, rebuilt by the same
sweep: each part's metadata holds the store mode, the space fingerprint (`space_fingerprint`,
also in the part's name), the chunk (its part name), the chunk's flat point range and the rows
written. A resume trusts a part only once its footer and content agree with its name
(`footer_problem`, `rows_problem`); a part that does not is named on stderr, removed and written
again (`drop_damaged`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

import numpy as np
import polars as pl

from trainmem.results._schema import SCHEMA
from trainmem.results._store import PartFooter, PendingPart, publish_pending, remove_part

from ._axes import AXES, LAYOUT, LAYOUT_AXES, NAMED_AXES
from ._options import STORE_MODES
from ._space import Space

PUBLISH_EVERY_S = 5.0
"""Longest wait before the parts written are published (fsynced, then visible): a killed
sweep loses at most this much evaluation, recomputed by its rerun; most sweeps publish once."""


def check_store(store: str) -> str:
    """`store` if it is one of STORE_MODES, else a ValueError naming them."""
    if store not in STORE_MODES:
        raise ValueError(f"store: unknown value '{store}'; allowed: {', '.join(STORE_MODES)}")
    return store


def points_per_layout(space: Space) -> int:
    """The points of one layout: the product of the axes after LAYOUT_AXES."""
    assert AXES[: len(LAYOUT_AXES)] == LAYOUT_AXES, "a layout's points must be consecutive"
    return int(np.prod([len(space.axes[a]) for a in AXES[len(LAYOUT_AXES) :]], dtype=np.int64))


def chunk_points(space: Space, *, chunk_size: int, store: str) -> int:
    """Points per chunk: `chunk_size`, or for best-per-layout whole layouts (a multiple of
    `points_per_layout`, at least one), so that no layout spans two parts."""
    if store != "best-per-layout":
        return chunk_size
    per_layout = points_per_layout(space)
    return max(per_layout, chunk_size // per_layout * per_layout)


def part_name(fingerprint: str, *, store: str, chunk: int) -> str:
    """`xFINGERPRINT-CHUNK` (all points), or `xFINGERPRINT-STORE-CHUNK`: a rerun with another
    --store writes its own parts instead of skipping a subset's."""
    mode = "" if store == "all" else f"-{store}"
    return f"x{fingerprint}{mode}-{chunk:06d}"


def stored_rows(frame: pl.DataFrame, *, store: str, keys: Sequence[str]) -> pl.DataFrame:
    """The rows of a chunk's points that its part keeps (`--store`), in point order.

    `keys`: the search's order (objectives, then tie-breaks); best-per-layout keeps, of each
    layout with a fitting point, the first fitting point in that order (ties: the first in the
    space); a chunk holds whole layouts (`chunk_points`).
    """
    if store == "all":
        return frame
    if store == "valid":
        return frame.filter(pl.col("reason") == "")
    fitting = frame.filter(pl.col("fits"))
    if store == "fits":
        return fitting
    return (
        fitting.with_row_index("_point")
        .sort([*keys, "_point"], nulls_last=True)
        .unique(subset=list(LAYOUT), keep="first")
        .sort("_point")
        .drop("_point")
    )


class PublishBatches:
    """The parts a sweep has written and not yet published; `add` publishes them once the
    oldest has waited PUBLISH_EVERY_S, `publish` at the end (or on an error: the parts written
    so far stay, and a rerun skips them)."""

    def __init__(self) -> None:
        self.pending: list[PendingPart] = []
        self.since = time.monotonic()

    def add(self, part: PendingPart | None) -> None:
        """Record a written part (None: nothing written); publish when the batch is due."""
        if part is None:
            return
        if not self.pending:
            self.since = time.monotonic()
        self.pending.append(part)
        if time.monotonic() - self.since >= PUBLISH_EVERY_S:
            self.publish()

    def publish(self) -> None:
        """Publish every pending part (`publish_pending`)."""
        batch, self.pending = self.pending, []
        publish_pending(batch)


def footer_problem(
    footer: PartFooter, *, part: str, lo: int, hi: int, fingerprint: str, store: str
) -> str | None:
    """Why a stored part cannot be the chunk `part` (points [lo, hi) of the space
    `fingerprint`, stored as `store`), or None: its schema, then each metadata entry it has
    (chunk, point range, fingerprint, store mode, rows written: a part of an older version has
    fewer) and, for store all, its row count against the chunk's."""
    if footer.schema != dict(SCHEMA):
        return "its columns are not the points table's"
    meta = footer.metadata
    expected = {
        "trainmem_chunk": part,
        "trainmem_point_range": f"{lo}-{hi}",
        "trainmem_space_fingerprint": fingerprint,
        "trainmem_store": store,
        "trainmem_num_rows": str(footer.num_rows),
    }
    for key, value in expected.items():
        if key in meta and meta[key] != value:
            return f"its {key[len('trainmem_') :]} is {meta[key]!r}, not {value!r}"
    if store == "all" and footer.num_rows != hi - lo:
        return f"it holds {footer.num_rows} rows; its chunk has {hi - lo}"
    return None


def rows_problem(space: Space, frame: pl.DataFrame, *, lo: int, hi: int) -> str | None:
    """Why a store-all part's rows are not the points [lo, hi) of `space` (each axis column
    against the space's values, in point order), or None."""
    if frame.height != hi - lo:
        return f"it holds {frame.height} rows; its chunk has {hi - lo}"
    expected = space.columns(range(lo, hi))
    gpus = np.array([p.gpu for p in space.fleet.pools], dtype=object)
    for axis in AXES:
        if axis == "pool":
            column, want = "gpu", gpus[expected["pool"]]
        elif axis in NAMED_AXES:
            column, want = axis, np.array(NAMED_AXES[axis], dtype=object)[expected[axis]]
        else:
            column, want = axis, expected[axis]
        got = frame[column].cast(pl.String) if column == "gpu" or axis in NAMED_AXES else None
        values = frame[column].to_numpy() if got is None else got.to_numpy().astype(object)
        if not np.array_equal(values.astype(want.dtype), want):
            return f"its {column} column is not its chunk's (points {lo}-{hi})"
    return None


def drop_damaged(out: str | os.PathLike[str], *, study: str, part: str, problem: str) -> None:
    """Say on stderr that the part at `problem` ("PATH: why") is rebuilt, and remove it so
    that its chunk's new part can take the name."""
    print(f"rebuilding damaged part {problem}", file=sys.stderr, flush=True)
    remove_part(out, study=study, part=part)
