"""Write and read the points table: Parquet under OUT/points/study=NAME/part-*.parquet.

Writes are atomic (a temporary file in the same folder, fsync, os.replace), so a reader or a
rerun after SIGKILL sees whole parts or none. Part names are chosen by the caller and
deterministic (chunk or trial range), so a rerun skips what exists and writes no point twice.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ._schema import SCHEMA, SCHEMA_VERSION

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def tool_version() -> str:
    """The installed trainmem version, stamped in each Parquet part's metadata ("0+unknown"
    in a source checkout that is not installed)."""
    try:
        return importlib_metadata.version("trainmem")
    except importlib_metadata.PackageNotFoundError:  # pragma: no cover - source checkout
        return "0+unknown"


def study_dir(out: str | os.PathLike[str], study: str) -> Path:
    """OUT/points/study=NAME (the study partition)."""
    if not _NAME_RE.match(study):
        raise ValueError(f"study: bad name {study!r}; use letters, digits, '.', '_' and '-'")
    return Path(out) / "points" / f"study={study}"


def points_frame(columns: Mapping[str, Any]) -> pl.DataFrame:
    """A frame with exactly SCHEMA's columns, in order (missing: null).

    Values: numpy arrays, polars Series, or scalars (repeated on every row).
    """
    lengths = {len(v) for v in columns.values() if isinstance(v, (np.ndarray, pl.Series))}
    if len(lengths) != 1:
        raise ValueError(f"points: columns must have one length, got {sorted(lengths)}")
    num_rows = lengths.pop()
    data = {}
    for name, dtype in SCHEMA.items():
        values = columns.get(name)
        if values is None:
            data[name] = pl.repeat(None, num_rows, dtype=dtype, eager=True).alias(name)
        elif isinstance(values, pl.Series):
            data[name] = values.alias(name).cast(dtype)
        elif isinstance(values, np.ndarray):
            if values.dtype == object:
                values = values.astype(str)
            data[name] = pl.Series(name, values).cast(dtype)
        else:
            data[name] = pl.repeat(values, num_rows, dtype=dtype, eager=True).alias(name)
    return pl.DataFrame(data)


def write_points(
    frame: pl.DataFrame,
    out: str | os.PathLike[str],
    *,
    study: str,
    part: str,
    trial: str = "",
) -> Path:
    """Write one part atomically; returns its path. `part` names the file (part-PART.parquet)."""
    folder = study_dir(out, study)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"part-{part}.parquet"
    meta = {
        "trainmem_version": tool_version(),
        "trainmem_schema_version": str(SCHEMA_VERSION),
        "trainmem_study": study,
        "trainmem_trial": trial,
    }
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".parquet", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            # No column statistics: a part is one chunk of a sweep, read whole by queries, and
            # min/max/null counts of ~46 columns cost a fifth of the write (and a third of the
            # bytes) of every part.
            frame.write_parquet(fh, compression="zstd", metadata=meta, statistics=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the umask's default
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def part_exists(out: str | os.PathLike[str], *, study: str, part: str) -> bool:
    """Whether OUT/points/study=STUDY holds part PART (a resumed sweep skips it)."""
    return (study_dir(out, study) / f"part-{part}.parquet").exists()


def scan_points(path: str | os.PathLike[str]) -> pl.LazyFrame:
    """Every stored point under a folder (OUT, OUT/points or one study's folder), lazily."""
    root = Path(path)
    files = sorted(root.rglob("part-*.parquet"))
    if not files:
        raise ValueError(f"points: no part-*.parquet files under {str(root)!r}")
    return pl.scan_parquet(files)


def read_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The key-value metadata of one part (version, schema version, study, trial)."""
    return pl.read_parquet_metadata(Path(path))
