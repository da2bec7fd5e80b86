"""An exhaustive sweep's Parquet parts: which points a chunk stores (`--store`), the parts'
names, and their publication in batches (one fsync round per batch, not per part).

`--store` keeps the table smaller; the points it leaves out are the space's, rebuilt by the same
sweep: each part's metadata holds the store mode, the space fingerprint (`space_fingerprint`,
also in the part's name) and the chunk's flat point range.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import polars as pl

from trainmem.results._store import PendingPart, publish_pending

from ._axes import AXES, LAYOUT, LAYOUT_AXES
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
