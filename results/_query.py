"""Query stored points: a polars SQL WHERE clause, a sort column, a row limit."""

from __future__ import annotations

import os

import polars as pl

from ._store import scan_points


def query_points(
    path: str | os.PathLike[str],
    *,
    where: str | None = None,
    sort: str | None = None,
    descending: bool = False,
    head: int | None = 10,
) -> pl.DataFrame:
    """Stored points under `path`, filtered by `where` (SQL, e.g. "fits AND num_gpus <= 16"),
    sorted by `sort` (nulls last), at most `head` rows. ValueError on a bad clause or column.

    >>> query_points("out", where="fits", sort="cost_per_million_tokens", head=10)  # doctest: +SKIP
    """
    lf = scan_points(path)
    names = lf.collect_schema().names()
    if sort is not None and sort not in names:
        raise ValueError(f"--sort: unknown column {sort!r}; columns: {', '.join(names)}")
    if head is not None and head < 0:
        raise ValueError(f"--head: must be >= 0, got {head}")
    try:
        if where:
            ctx = pl.SQLContext(points=lf)
            lf = ctx.execute(f"SELECT * FROM points WHERE {where}")
        if sort is not None:
            lf = lf.sort(sort, descending=descending, nulls_last=True)
        if head is not None:
            lf = lf.head(head)
        return lf.collect()
    except (pl.exceptions.PolarsError, pl.exceptions.SQLSyntaxError) as error:
        message = " ".join(str(error).split())
        raise ValueError(f"--where: {message}") from None
