"""Points-table helpers for the tests: parts as an older trainmem wrote them."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from trainmem.results._schema import BYTE_COLUMNS


def rewrite_as_schema_3(path: Path, *, add_bytes: float = 0.0) -> None:
    """Rewrite one part as schema 3 stored it: strings as String, byte columns as Float64
    (plus `add_bytes`, a fraction of a byte that readers round away), schema version "3"."""
    meta = pl.read_parquet_metadata(path)
    frame = pl.read_parquet(path)
    frame = frame.with_columns(
        *(pl.col(c).cast(pl.String) for c, t in frame.schema.items() if t == pl.Categorical),
        *(pl.col(c).cast(pl.Float64) + add_bytes for c in BYTE_COLUMNS),
    )
    old = {k: v for k, v in meta.items() if k.startswith("trainmem_")}
    old["trainmem_schema_version"] = "3"
    for key in ("trainmem_store", "trainmem_space_fingerprint", "trainmem_point_range"):
        old.pop(key, None)
    frame.write_parquet(path, compression="zstd", metadata=old)
