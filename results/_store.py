"""Write and read the points table: Parquet under OUT/points/study=NAME/part-*.parquet.

A part gets its name (`part-PART.parquet`, what readers glob) only as a hard link to a complete
file whose data was fsynced first, and the link fails if the part exists: a reader sees whole
parts or none, even after a power loss, and two processes writing one part leave one. Part names
are chosen by the caller and deterministic (chunk or trial range), so a rerun skips what exists
and writes no point twice. Files being written are temporaries in the same folder
(`.tmp-HOST-PID-*.parquet`, PID the owning run's), invisible to readers; `clean_temporaries`
removes those of runs that died.

Two ways to write a part:

- `write_points`: durable on return (write, fsync, link, fsync the folder): Optuna's batches.
  `staged`: the name is `.staged-PART.parquet`, invisible to readers until `publish_points`.
- `write_pending`, then `publish_pending` for many parts at once: a sweep's chunks. The parts are
  written without an fsync each; publishing fsyncs the batch's files together (concurrently, so
  that the filesystem can commit them in one journal transaction), links each to its name, and
  fsyncs the folder once. What a crash leaves:
    - the process killed (SIGKILL, out of memory) before a batch is published: its temporaries,
      invisible; the next run removes them (their owner is dead) and evaluates those chunks
      again. Published parts are whole (the page cache outlives the process).
    - the machine down (power loss, kernel panic): a name that survives points at a complete
      file (its data was on disk before the link); a link made after the last folder fsync may
      be gone (that chunk is evaluated again); temporaries may be torn, and are removed.
  Either way no visible part is partial or corrupt, and the loss is the unpublished batch's
  evaluation time, never a point of the table.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import polars as pl

from ._schema import BYTE_COLUMNS, SCHEMA, SCHEMA_VERSION

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
HOST_TAG = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
"""This machine in temporary file names (`.tmp-HOST-PID-*.parquet`): a pid is checked only on
its own host."""
_TMP_RE = re.compile(r"^\.tmp-([0-9a-f]{8})-(\d+)-.*\.parquet$")
FOREIGN_TMP_AGE_S = 3600.0
"""A temporary file of another host (a shared folder) is removed once this old: a part's write
takes seconds."""
ZSTD_LEVEL = 3
"""zstd level of every part. `python -m bench.sweep --zstd-levels`, the 405B case (12 parts of
100,000 points, schema 4), on a shared 2-core machine:
level 1: 0.32-0.36 s to write, 11,108,273 bytes; level 3: 0.37 s, 10,255,345 bytes;
level 6: 0.55-0.73 s, 9,802,399 bytes (the 70B cases alike: level 1 0-40% faster than 3 for
4-5% more bytes). The writer thread works while the next chunk is evaluated (0.35 s of writing
under 0.64 s of evaluation there), so bytes weigh more than write time: level 3 (zstd's
default) over 1; level 6 costs half again the write time for 4% fewer bytes."""
SYNC_THREADS = 8
"""Files fsynced at once when a batch of pending parts is published. 12 parts of 700 KB on
ext4: 80-92 ms fsynced one by one as written, 30-56 ms in turn at the end, 12-28 ms at once."""


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
    """A frame with exactly SCHEMA's columns and dtypes, in order (missing: null).

    Values: numpy arrays, polars Series, or scalars (repeated on every row); byte columns
    given as floats are rounded to whole bytes (NaN and infinities: null), strings become
    categoricals.
    """
    lengths = {len(v) for v in columns.values() if isinstance(v, (np.ndarray, pl.Series))}
    if len(lengths) != 1:
        raise ValueError(f"points: columns must have one length, got {sorted(lengths)}")
    num_rows = lengths.pop()
    data = {}
    for name, dtype in SCHEMA.items():
        values = columns.get(name)
        if isinstance(values, (np.ndarray, pl.Series)):
            data[name] = _stored_column(_series(name, values), dtype)
        else:  # one value (None: null) on every row
            data[name] = _constant(name, values, dtype, num_rows)
    return pl.DataFrame(data)


def _constant(name: str, value: Any, dtype: Any, num_rows: int) -> pl.Series:
    """A column of `num_rows` copies of `value`: one value's series repeated by its index,
    about 20x faster than pl.repeat(..., eager=True), which runs a lazy query per column
    (a sweep's chunk has some 45 such columns)."""
    return pl.Series(name, [value], dtype=dtype).new_from_index(0, num_rows)


def _series(name: str, values: np.ndarray | pl.Series) -> pl.Series:
    if isinstance(values, pl.Series):
        return values.alias(name)
    if values.dtype == object:
        values = values.astype(str)
    return pl.Series(name, values)


def _stored_column(series: pl.Series, dtype: Any) -> pl.Series:
    """`series` as stored: floats into an integer column rounded (NaN, infinities: null)."""
    if series.dtype.is_float() and dtype == pl.Int64:
        series = series.fill_nan(None).round(0).cast(pl.Int64, strict=False)
    return series.cast(dtype)


def stored_frame(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` (SCHEMA's columns, as stored or as read) with SCHEMA's dtypes."""
    if frame.schema == SCHEMA:
        return frame
    return frame.with_columns(_stored_column(frame[n], d) for n, d in SCHEMA.items())


_Frame = TypeVar("_Frame", pl.DataFrame, pl.LazyFrame)


def read_view(frame: _Frame) -> _Frame:
    """`frame` (stored points, any schema version) as readers see them (READ_SCHEMA): the
    categoricals as strings; byte columns of schema 3 and older (Float64) rounded to Int64."""
    schema = frame.collect_schema() if isinstance(frame, pl.LazyFrame) else frame.schema
    casts = []
    for name, dtype in schema.items():
        if dtype == pl.Categorical or isinstance(dtype, pl.Enum):
            casts.append(pl.col(name).cast(pl.String))
        elif name in BYTE_COLUMNS and dtype.is_float():
            casts.append(pl.col(name).fill_nan(None).round(0).cast(pl.Int64, strict=False))
    return frame.with_columns(casts) if casts else frame


def _metadata(study: str, trial: str, provenance: Mapping[str, str] | None) -> dict[str, str]:
    """A part's key-value metadata: tool and schema versions, study, trial, store mode
    ("all" unless `provenance` says otherwise), and `provenance`'s entries (names without the
    `trainmem_` prefix)."""
    meta = {
        "trainmem_version": tool_version(),
        "trainmem_schema_version": str(SCHEMA_VERSION),
        "trainmem_study": study,
        "trainmem_trial": trial,
        "trainmem_store": "all",
    }
    meta.update({f"trainmem_{k}": str(v) for k, v in (provenance or {}).items()})
    return meta


def _write_temporary(
    frame: pl.DataFrame, folder: Path, meta: dict[str, str], *, owner_pid: int, sync: bool
) -> str:
    """Write `frame` to a new temporary file in `folder` named after `owner_pid`; fsync it
    when `sync`. Returns its path (removed again if the write fails)."""
    prefix = f".tmp-{HOST_TAG}-{owner_pid}-"
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".parquet", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            # No column statistics: a part is one chunk of a sweep, read whole by queries, and
            # min/max/null counts of ~46 columns cost a fifth of the write (and a third of the
            # bytes) of every part.
            stored_frame(frame).write_parquet(
                fh,
                compression="zstd",
                compression_level=ZSTD_LEVEL,
                metadata=meta,
                statistics=False,
            )
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the umask's default
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def write_points(
    frame: pl.DataFrame,
    out: str | os.PathLike[str],
    *,
    study: str,
    part: str,
    trial: str = "",
    staged: bool = False,
    provenance: Mapping[str, str] | None = None,
) -> Path:
    """Write one part durably and atomically, unless it exists (another writer's, kept);
    returns its path.

    `part` names the file (part-PART.parquet); `staged`: .staged-PART.parquet, which readers
    do not see until `publish_points`. `provenance`: more metadata (`_metadata`).
    """
    folder = study_dir(out, study)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (f".staged-{part}.parquet" if staged else f"part-{part}.parquet")
    meta = _metadata(study, trial, provenance)
    tmp = _write_temporary(frame, folder, meta, owner_pid=os.getpid(), sync=True)
    try:
        _link_once(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    if not staged:  # a staged part's name is made durable when it is published
        _fsync(folder)
    return path


@dataclass(frozen=True, slots=True)
class PendingPart:
    """A part written to a temporary file, not yet fsynced nor visible (`publish_pending`)."""

    tmp: str
    """The temporary file."""
    path: Path
    """The part's name once published."""


def write_pending(
    frame: pl.DataFrame,
    out: str | os.PathLike[str],
    *,
    study: str,
    part: str,
    provenance: Mapping[str, str] | None = None,
    owner_pid: int | None = None,
) -> PendingPart:
    """Write one part to a temporary file, without an fsync; it is invisible to readers until
    `publish_pending`. `owner_pid`: the run that publishes it (default: this process; a worker
    process gives its parent's, so the file is not taken for a dead writer's while the run
    lives)."""
    folder = study_dir(out, study)
    folder.mkdir(parents=True, exist_ok=True)
    meta = _metadata(study, "", provenance)
    owner = os.getpid() if owner_pid is None else owner_pid
    tmp = _write_temporary(frame, folder, meta, owner_pid=owner, sync=False)
    return PendingPart(tmp=tmp, path=folder / f"part-{part}.parquet")


def publish_pending(pending: Sequence[PendingPart]) -> int:
    """Make pending parts durable and visible: fsync their files (SYNC_THREADS at once), link
    each to its part name unless the part exists (another run's, kept), drop the temporaries,
    fsync each folder once. Returns the parts linked."""
    if not pending:
        return 0
    with ThreadPoolExecutor(max_workers=SYNC_THREADS, thread_name_prefix="trainmem-fsync") as ex:
        list(ex.map(_fsync, [p.tmp for p in pending]))
    linked = 0
    for p in pending:
        try:
            linked += _link_once(p.tmp, p.path)
        finally:
            Path(p.tmp).unlink(missing_ok=True)
    for folder in sorted({p.path.parent for p in pending}):
        _fsync(folder)
    return linked


def discard_pending(pending: Sequence[PendingPart]) -> None:
    """Remove pending parts' temporaries (their sweep failed before publishing them)."""
    for p in pending:
        Path(p.tmp).unlink(missing_ok=True)


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


def _fsync(path: str | os.PathLike[str]) -> None:
    """fsync a file, or a folder (its entries: the names linked into it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_points(out: str | os.PathLike[str], *, study: str, part: str) -> Path:
    """Make staged part PART visible (part-PART.parquet) and drop its staged name; returns the
    part's path. Idempotent: a part already published (by a concurrent recovery) is kept."""
    folder = study_dir(out, study)
    staged, path = folder / f".staged-{part}.parquet", folder / f"part-{part}.parquet"
    if staged.exists():
        _link_once(staged, path)
        staged.unlink(missing_ok=True)
        _fsync(folder)
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
    """Every stored point under a folder (OUT, OUT/points or one study's folder), lazily, as
    readers see them (`read_view`: strings, Int64 bytes, whatever the parts' schema version)."""
    root = Path(path)
    files = sorted(root.rglob("part-*.parquet"))
    if not files:
        raise ValueError(f"points: no part-*.parquet files under {str(root)!r}")
    return scan_parts(files)


def scan_parts(files: Sequence[str | os.PathLike[str]]) -> pl.LazyFrame:
    """The points of part files, lazily, as readers see them (`read_view`). Parts of one
    schema are scanned together; parts of several (a folder written before and after a
    schema change) are each brought to READ_SCHEMA's dtypes, then concatenated."""
    groups: dict[tuple[tuple[str, str], ...], list[Path]] = {}
    for f in map(Path, files):
        try:
            schema = pl.read_parquet_schema(f)
        except (OSError, pl.exceptions.PolarsError) as error:
            message = " ".join(str(error).split())[:200]
            raise ValueError(f"points: {f}: unreadable part: {message}") from None
        groups.setdefault(tuple((k, str(v)) for k, v in schema.items()), []).append(f)
    frames = [read_view(pl.scan_parquet(group)) for group in groups.values()]
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical")


def read_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The key-value metadata of one part: trainmem_version, trainmem_schema_version,
    trainmem_study, trainmem_trial, trainmem_store (what the part holds of the points it
    covers: sweep/_options.py STORE_MODES; absent before schema 4: all) and, for a sweep's part,
    trainmem_space_fingerprint and trainmem_point_range (its chunk: flat indices LO-HI)."""
    return pl.read_parquet_metadata(Path(path))
