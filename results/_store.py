"""Write and read the points table: Parquet under OUT/points/study=NAME/part-*.parquet.

Writes are atomic and exclusive: a temporary file in the same folder (named by host and pid),
fsync, then a hard link to the part's name that fails if the part exists, so a reader or a
rerun after SIGKILL sees whole parts or none, and two processes writing one part leave one.
Part names are chosen by the caller and deterministic (chunk or trial range), so a rerun skips
what exists and writes no point twice. A staged part (`.staged-PART.parquet`) is invisible to
readers (`part-*.parquet`) until `publish_points` links it; `clean_temporaries` removes the
temporary files of writers that died.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import tempfile
import time
from collections.abc import Mapping
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ._schema import SCHEMA, SCHEMA_VERSION

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
HOST_TAG = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
"""This machine in temporary file names (`.tmp-HOST-PID-*.parquet`): a pid is checked only on
its own host."""
_TMP_RE = re.compile(r"^\.tmp-([0-9a-f]{8})-(\d+)-.*\.parquet$")
FOREIGN_TMP_AGE_S = 3600.0
"""A temporary file of another host (a shared folder) is removed once this old: a part's write
takes seconds."""


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
    staged: bool = False,
) -> Path:
    """Write one part atomically, unless it exists (another writer's, kept); returns its path.

    `part` names the file (part-PART.parquet); `staged`: .staged-PART.parquet, which readers
    do not see until `publish_points`.
    """
    folder = study_dir(out, study)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (f".staged-{part}.parquet" if staged else f"part-{part}.parquet")
    meta = {
        "trainmem_version": tool_version(),
        "trainmem_schema_version": str(SCHEMA_VERSION),
        "trainmem_study": study,
        "trainmem_trial": trial,
    }
    prefix = f".tmp-{HOST_TAG}-{os.getpid()}-"
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".parquet", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            # No column statistics: a part is one chunk of a sweep, read whole by queries, and
            # min/max/null counts of ~46 columns cost a fifth of the write (and a third of the
            # bytes) of every part.
            frame.write_parquet(fh, compression="zstd", metadata=meta, statistics=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the umask's default
        _link_once(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    if not staged:  # a staged part's name is made durable when it is published
        _fsync_dir(folder)
    return path


def _link_once(source: str | os.PathLike[str], target: Path) -> bool:
    """Give `source` the name `target` unless `target` exists (then False, `target` kept): a
    hard link, which never replaces; os.replace where the filesystem has no hard links."""
    try:
        os.link(source, target)
    except FileExistsError:
        return False
    except OSError:  # no hard links here (some network and FUSE filesystems)
        if target.exists():
            return False
        os.replace(source, target)
    return True


def _fsync_dir(folder: Path) -> None:
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def publish_points(out: str | os.PathLike[str], *, study: str, part: str) -> Path:
    """Make staged part PART visible (part-PART.parquet) and drop its staged name; returns the
    part's path. Idempotent: a part already published (by a concurrent recovery) is kept."""
    folder = study_dir(out, study)
    staged, path = folder / f".staged-{part}.parquet", folder / f"part-{part}.parquet"
    if staged.exists():
        _link_once(staged, path)
        staged.unlink(missing_ok=True)
        _fsync_dir(folder)
    return path


def staged_parts(out: str | os.PathLike[str], *, study: str) -> list[str]:
    """The names (PART) of the staged, unpublished parts of a study."""
    folder = study_dir(out, study)
    return sorted(p.name[len(".staged-") : -len(".parquet")] for p in folder.glob(".staged-*"))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    try:  # a killed child not yet reaped is a zombie: dead
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]


def clean_temporaries(
    out: str | os.PathLike[str], *, study: str, before: float | None = None
) -> int:
    """Remove the temporary files (`.tmp-*.parquet`) that no live writer owns; returns how many.

    Owned by a dead process of this host: removed; of another host: removed once older than
    FOREIGN_TMP_AGE_S; unnamed (written before names carried the pid): removed when last
    modified before `before` (a time.time(); default: now).
    """
    folder = study_dir(out, study)
    now = time.time()
    removed = 0
    for path in folder.glob(".tmp-*.parquet"):
        match = _TMP_RE.match(path.name)
        try:
            age_s = now - path.stat().st_mtime
            if match is None:
                stale = path.stat().st_mtime < (now if before is None else before)
            elif match.group(1) == HOST_TAG:
                stale = int(match.group(2)) != os.getpid() and not _pid_alive(int(match.group(2)))
            else:
                stale = age_s > FOREIGN_TMP_AGE_S
            if stale:
                path.unlink()
                removed += 1
        except FileNotFoundError:  # removed meanwhile by its writer or another cleaner
            continue
    return removed


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
