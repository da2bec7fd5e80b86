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

OUT may also be a URL (`is_url`: s3://, gs://, hdfs://, abfs://, any fsspec protocol; file://
is a local path, written as above), opened with pyarrow's filesystems (`url_filesystem`). The
processes that evaluate a sweep's chunks (a cluster's workers) then write its parts themselves:

- on an object store (ATOMIC_PUT_SCHEMES) a part is put under its name in one request (one PUT,
  or a multipart upload that the store completes on close): an object appears whole or not at
  all, so there is no temporary file, no rename and no fsync, and nothing to publish. A worker
  killed mid-write leaves no object (an unfinished multipart upload is invisible; the bucket's
  lifecycle rule drops it); a rerun evaluates that chunk again. Two writers of one part put the
  same bytes (deterministic names and points): the last PUT wins, equal to the first.
- elsewhere (hdfs://, ...) a part is written as a temporary (`.tmp-HOST-PID-*.parquet`, the
  owning run's host and pid) and moved to its name, skipped if the name exists meanwhile.

Either way a visible part is whole, and a rerun skips it (`part_exists` asks the store).
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import hashlib
import io
import os
import re
import socket
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import polars as pl

from trainmem.hardware._files import check_path_name, shown_path

from ._schema import BYTE_COLUMNS, READ_SCHEMA, SCHEMA, SCHEMA_VERSION

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")  # \Z, not $: no trailing newline
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
    """OUT/points/study=NAME (the study partition) of a folder (file:// URLs as paths);
    ValueError for another URL (`study_location`)."""
    if is_url(out):
        raise ValueError(f"out: {os.fspath(out)!r} is a URL; this needs a folder (local or shared)")
    return local_path(out) / "points" / f"study={_checked(study)}"


def _checked(study: str) -> str:
    if not _NAME_RE.match(study):
        raise ValueError(f"study_name: bad name {study!r}; use letters, digits, '.', '_' and '-'")
    return study


def study_location(out: str | os.PathLike[str], study: str) -> str:
    """OUT/points/study=NAME as text: a folder's path, or a URL under OUT's URL."""
    if is_url(out):
        return f"{os.fspath(out).rstrip('/')}/points/study={_checked(study)}"
    return str(study_dir(out, study))


# ---- URLs: object stores and other remote filesystems ------------------------------------------

_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
ATOMIC_PUT_SCHEMES = ("s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "memory")
"""URL schemes of object stores, where a written object appears whole or not at all: a part is
put under its name directly (no temporary, no rename). memory:// is fsspec's in-memory store
(tests)."""


def is_url(out: str | os.PathLike[str]) -> bool:
    """Whether `out` is a URL of a filesystem other than the local one (file:// is a path)."""
    text = os.fspath(out)
    return bool(_URL_RE.match(text)) and not text.startswith("file://")


def local_path(out: str | os.PathLike[str]) -> Path:
    """`out` as a local path: a file:// URL's path (file:///shared/x -> /shared/x)."""
    text = os.fspath(out)
    if text.startswith("file://"):
        return Path(urllib.parse.unquote(urllib.parse.urlsplit(text).path))
    return Path(text)


@functools.lru_cache(maxsize=16)
def url_filesystem(url: str) -> tuple[Any, str]:
    """The pyarrow filesystem of a URL and the path in it: pyarrow's own (s3://, gs://,
    hdfs://, abfs://), else fsspec's (memory://, az://, ...) through pyarrow's FSSpecHandler.
    ValueError ("out: ...") when neither opens it. Cached: a worker resolves a store once."""
    import pyarrow as pa
    import pyarrow.fs as pafs

    try:
        fs, path = pafs.FileSystem.from_uri(url)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:  # a scheme pyarrow lacks
        try:
            import fsspec

            spec_fs, path = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as spec_error:
            message = " ".join(f"{error}; fsspec: {spec_error}".split())[:200]
            raise ValueError(f"out: cannot open {url!r}: {message}") from None
        fs = pafs.PyFileSystem(pafs.FSSpecHandler(spec_fs))
    except OSError as error:  # e.g. a store that cannot be reached or authenticated
        message = " ".join(str(error).split())[:200]
        raise ValueError(f"out: cannot open {url!r}: {message}") from None
    return fs, path if path in ("", "/") else path.rstrip("/")


def _under(root: str, relative: str) -> str:
    """`relative` under a filesystem path `root` ("": the store's top, as mock:// gives)."""
    return f"{root}{relative}" if root.endswith("/") or not root else f"{root}/{relative}"


def _url_scheme(url: str) -> str:
    return url.split("://", 1)[0].lower()


def _url_study(out: str | os.PathLike[str], study: str) -> tuple[Any, str]:
    """The filesystem and the study folder's path in it of a URL OUT."""
    fs, root = url_filesystem(os.fspath(out).rstrip("/"))
    return fs, _under(root, f"points/study={_checked(study)}")


def _url_files(fs: Any, folder: str, pattern: str, *, recursive: bool) -> list[Any]:
    """The files (pyarrow FileInfo) under `folder` whose name matches `pattern`, by path."""
    import pyarrow.fs as pafs

    selector = pafs.FileSelector(folder, recursive=recursive, allow_not_found=True)
    infos = fs.get_file_info(selector)
    found = [i for i in infos if i.type == pafs.FileType.File]
    return sorted((i for i in found if fnmatch.fnmatch(i.base_name, pattern)), key=_info_path)


def _info_path(info: Any) -> str:
    return str(info.path)


def _put_url(data: bytes, out: str, *, study: str, name: str, owner: str) -> None:
    """Store one part's bytes under its name on a URL store: in place on an object store
    (ATOMIC_PUT_SCHEMES: one PUT), else as a temporary named after `owner` (HOST-PID) moved to
    its name unless the name exists meanwhile (another writer's: the same points)."""
    fs, folder = _url_study(out, study)
    target = f"{folder}/{name}"
    if _url_scheme(out) in ATOMIC_PUT_SCHEMES:
        with fs.open_output_stream(target, compression=None) as fh:
            fh.write(data)
        return
    import pyarrow.fs as pafs

    fs.create_dir(folder, recursive=True)
    tmp = f"{folder}/.tmp-{owner}-{uuid.uuid4().hex[:12]}.parquet"
    try:
        with fs.open_output_stream(tmp, compression=None) as fh:
            fh.write(data)
        if fs.get_file_info(target).type == pafs.FileType.NotFound:
            fs.move(tmp, target)
    finally:
        if fs.get_file_info(tmp).type != pafs.FileType.NotFound:
            fs.delete_file(tmp)


def _read_url(fs: Any, path: str) -> bytes:
    with fs.open_input_file(path) as fh:
        return bytes(fh.readall())


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
        series = _whole_numbers(series)
    return series if series.dtype == dtype else series.cast(dtype)


_INT64_BOUND = 2.0**63
"""The rounded floats below this in magnitude convert to Int64 exactly."""


def _whole_numbers(series: pl.Series) -> pl.Series:
    """A float column rounded half to even into Int64, null where it is NaN, infinite or out
    of Int64's range. Without nulls (a chunk's byte columns: all finite) in numpy, where the
    rounding (np.rint, IEEE round half to even: polars' `round(0)`) and the conversion are two
    passes instead of three lazy queries."""
    if not series.has_nulls():
        rounded = np.rint(series.to_numpy())
        if np.all(np.abs(rounded) < _INT64_BOUND):  # false for NaN and infinities
            return pl.Series(series.name, rounded.astype(np.int64))
    return series.fill_nan(None).round(0).cast(pl.Int64, strict=False)


def stored_frame(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` (SCHEMA's columns, as stored or as read) with SCHEMA's dtypes."""
    if frame.schema == SCHEMA:
        return frame
    return frame.with_columns(_stored_column(frame[n], d) for n, d in SCHEMA.items())


_Frame = TypeVar("_Frame", pl.DataFrame, pl.LazyFrame)


def read_view(frame: _Frame) -> _Frame:
    """`frame` (stored points, any schema version) as readers see them (READ_SCHEMA): the
    categoricals as strings; byte columns of schema 3 and older (Float64) rounded to Int64; a
    column an older schema lacks (the error-bar and risk columns before 7) null, in READ_SCHEMA's
    order (parts of several schemas then concatenate column by column)."""
    schema = frame.collect_schema() if isinstance(frame, pl.LazyFrame) else frame.schema
    names: list[str] = list(schema.names())
    missing = [n for n in READ_SCHEMA if n not in names]
    if missing:  # a part older than a column (schema 6: error bars, risk): null, in order
        added = frame.with_columns(pl.lit(None, dtype=READ_SCHEMA[n]).alias(n) for n in missing)
        order = [*READ_SCHEMA, *(n for n in names if n not in READ_SCHEMA)]
        return read_view(added.select(order))  # type: ignore[return-value]
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


def _write_parquet(frame: pl.DataFrame, fh: Any, meta: dict[str, str]) -> None:
    """Write `frame` as one part's Parquet (SCHEMA's dtypes, zstd, `meta` and
    trainmem_num_rows, the rows written: a resume checks the part against it) to a binary
    file."""
    meta = {**meta, "trainmem_num_rows": str(frame.height)}
    try:
        _write_parquet_file(frame, fh, meta)
    except pl.exceptions.PolarsError as error:  # polars' wrapping of the file's own OSError
        raise _os_error(error) from None


_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def _os_error(error: Exception) -> Exception:
    """The OSError that a polars error wraps ("... No space left on device (os error 28)"),
    so that a full disk is reported as one, naming the folder; else `error` itself."""
    match = _OS_ERROR.search(str(error))
    if match is None:
        return error
    code = int(match.group(1))
    return OSError(code, os.strerror(code))


def _write_parquet_file(frame: pl.DataFrame, fh: Any, meta: dict[str, str]) -> None:
    # No column statistics: a part is one chunk of a sweep, read whole by queries, and min/max/
    # null counts of ~46 columns cost a fifth of the write (and a third of the bytes) of every
    # part.
    stored_frame(frame).write_parquet(
        fh, compression="zstd", compression_level=ZSTD_LEVEL, metadata=meta, statistics=False
    )


def _write_temporary(
    frame: pl.DataFrame,
    folder: Path,
    meta: dict[str, str],
    *,
    owner_pid: int,
    sync: bool,
    owner_host: str = HOST_TAG,
) -> str:
    """Write `frame` to a new temporary file in `folder` named after its owner (`owner_host`,
    `owner_pid`: the run that publishes it); fsync it when `sync`. Returns its path (removed
    again if the write fails)."""
    prefix = f".tmp-{owner_host}-{owner_pid}-"
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".parquet", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            _write_parquet(frame, fh, meta)
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
    owner_host: str | None = None,
) -> PendingPart | None:
    """Write one part to a temporary file, without an fsync; it is invisible to readers until
    `publish_pending`. `owner_pid`, `owner_host`: the run that publishes it (default: this
    process on this host; a worker process gives its parent's, a cluster's worker its
    coordinator's, so the file is not taken for a dead writer's while the run lives).

    A URL OUT (`is_url`): the part is stored under its name at once (`_put_url`: visible and
    whole on return) and None is returned: nothing to publish."""
    meta = _metadata(study, "", provenance)
    owner = os.getpid() if owner_pid is None else owner_pid
    host = HOST_TAG if owner_host is None else owner_host
    if is_url(out):
        data = io.BytesIO()
        _write_parquet(frame, data, meta)
        _put_url(
            data.getvalue(),
            os.fspath(out),
            study=study,
            name=f"part-{part}.parquet",
            owner=f"{host}-{owner}",
        )
        return None
    folder = study_dir(out, study)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = _write_temporary(frame, folder, meta, owner_pid=owner, sync=False, owner_host=host)
    return PendingPart(tmp=tmp, path=folder / f"part-{part}.parquet")


def publish_pending(pending: Sequence[PendingPart]) -> int:
    """Make pending parts durable and visible: fsync their files (SYNC_THREADS at once), link
    each to its part name unless the part exists (another run's, kept), drop the temporaries,
    fsync each folder once. Returns the parts linked. A failed fsync (a full disk) removes
    the batch's temporaries before it is raised: nothing is left behind, and a rerun evaluates
    those chunks again."""
    if not pending:
        return 0
    try:
        with ThreadPoolExecutor(
            max_workers=SYNC_THREADS, thread_name_prefix="trainmem-fsync"
        ) as ex:
            list(ex.map(_fsync, [p.tmp for p in pending]))
    except BaseException:
        discard_pending(pending)
        raise
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
    modified before `before` (a time.time(); default: now). A missing folder has none; so has
    a study on an object store (parts are put in place).
    """
    now = time.time()
    if is_url(out):
        return _clean_url_temporaries(out, study=study, now=now, before=before)
    removed = 0
    for path in study_dir(out, study).glob(".tmp-*.parquet"):
        try:
            if _stale(path.name, path.stat().st_mtime, now=now, before=before):
                path.unlink()
                removed += 1
        except FileNotFoundError:  # removed meanwhile by its writer or another cleaner
            continue
    return removed


def _stale(name: str, mtime: float, *, now: float, before: float | None) -> bool:
    """Whether the temporary file `name` (last modified at `mtime`) has no live writer
    (`clean_temporaries`)."""
    match = _TMP_RE.match(name)
    if match is None:
        return mtime < (now if before is None else before)
    if match.group(1) == HOST_TAG:
        pid = int(match.group(2))
        return pid != os.getpid() and not _pid_alive(pid)
    return now - mtime > FOREIGN_TMP_AGE_S


def _clean_url_temporaries(
    out: str | os.PathLike[str], *, study: str, now: float, before: float | None
) -> int:
    """`clean_temporaries` on a URL store (its listing's modification times; none known: new)."""
    if _url_scheme(os.fspath(out)) in ATOMIC_PUT_SCHEMES:
        return 0
    fs, folder = _url_study(out, study)
    removed = 0
    for info in _url_files(fs, folder, ".tmp-*.parquet", recursive=False):
        mtime = info.mtime.timestamp() if info.mtime is not None else now
        if _stale(info.base_name, mtime, now=now, before=before):
            try:
                fs.delete_file(info.path)
            except FileNotFoundError:  # removed meanwhile
                continue
            removed += 1
    return removed


def part_exists(out: str | os.PathLike[str], *, study: str, part: str) -> bool:
    """Whether OUT/points/study=STUDY holds part PART (a resumed sweep skips it)."""
    if is_url(out):
        import pyarrow.fs as pafs

        fs, folder = _url_study(out, study)
        info = fs.get_file_info(f"{folder}/part-{part}.parquet")
        return bool(info.type != pafs.FileType.NotFound)
    return (study_dir(out, study) / f"part-{part}.parquet").exists()


@dataclass(frozen=True, slots=True)
class PartFooter:
    """What a part's Parquet footer says, read without its data (`read_footer`)."""

    path: str
    """The part's path or URL (named in messages)."""
    num_rows: int
    """The rows the footer counts."""
    schema: dict[str, Any]
    """Its columns' polars dtypes, in order."""
    metadata: dict[str, str]
    """Its key-value metadata (`read_metadata`)."""


class DamagedPart(ValueError):
    """A part that cannot be read, or whose content is not what its name says."""


def part_path(out: str | os.PathLike[str], *, study: str, part: str) -> str:
    """Part PART's path (or URL) under OUT."""
    if is_url(out):
        return f"{study_location(out, study)}/part-{part}.parquet"
    return str(study_dir(out, study) / f"part-{part}.parquet")


def read_footer(out: str | os.PathLike[str], *, study: str, part: str) -> PartFooter:
    """Part PART's footer (rows, schema, metadata); DamagedPart naming the file when it is not
    a readable Parquet file (garbage, truncated)."""
    import pyarrow.parquet as pq

    path = part_path(out, study=study, part=part)
    try:
        if is_url(out):
            fs, folder = _url_study(out, study)
            source: Any = io.BytesIO(_read_url(fs, f"{folder}/part-{part}.parquet"))
        else:
            source = path
        footer = pq.ParquetFile(source).metadata
        kv = {k.decode(): v.decode() for k, v in (footer.metadata or {}).items()}
        arrow_schema = footer.schema.to_arrow_schema().remove_metadata()
        schema = dict(pl.from_arrow(arrow_schema.empty_table()).schema)  # type: ignore[union-attr]
    except FileNotFoundError:
        raise
    except Exception as error:  # pyarrow's ArrowInvalid, OSError, UnicodeDecodeError, ...
        raise DamagedPart(f"{path}: {_short(error)}") from None
    kv.pop("ARROW:schema", None)
    return PartFooter(path=path, num_rows=int(footer.num_rows), schema=schema, metadata=kv)


def _short(error: BaseException) -> str:
    return " ".join(str(error).split())[:200] or type(error).__name__


def remove_part(out: str | os.PathLike[str], *, study: str, part: str) -> None:
    """Remove part PART (a damaged one, to be written again); gone already: nothing."""
    if is_url(out):
        fs, folder = _url_study(out, study)
        with contextlib.suppress(FileNotFoundError):
            fs.delete_file(f"{folder}/part-{part}.parquet")
        return
    Path(part_path(out, study=study, part=part)).unlink(missing_ok=True)


def read_part(out: str | os.PathLike[str], *, study: str, part: str) -> pl.DataFrame:
    """Part PART of OUT/points/study=STUDY as stored (a folder's or a URL's); DamagedPart
    naming the file when it cannot be read."""
    try:
        if is_url(out):
            fs, folder = _url_study(out, study)
            return pl.read_parquet(_read_url(fs, f"{folder}/part-{part}.parquet"))
        return pl.read_parquet(study_dir(out, study) / f"part-{part}.parquet")
    except FileNotFoundError:
        raise
    except Exception as error:  # polars' ComputeError, a zstd error, OSError, ...
        raise DamagedPart(f"{part_path(out, study=study, part=part)}: {_short(error)}") from None


def part_files(path: str | os.PathLike[str]) -> tuple[Any, list[str]]:
    """The part files (`part-*.parquet`) under a folder or URL, by path, and the pyarrow
    filesystem that holds them (None: the local one)."""
    if is_url(path):
        fs, root = url_filesystem(os.fspath(path).rstrip("/"))
        return fs, [i.path for i in _url_files(fs, root, "part-*.parquet", recursive=True)]
    check_path_name(path, what="points")
    files = sorted(local_path(path).rglob("part-*.parquet"))
    for file in files:  # a FIFO would block the reader, a device never end
        if not file.is_file():
            raise ValueError(f"points: {shown_path(file)}: not a regular file; not a part")
    return None, [str(f) for f in files]


def open_part(fs: Any, file: str) -> Any:
    """One part file opened for binary reading (a context manager; `fs` None: local)."""
    return open(file, "rb") if fs is None else fs.open_input_file(file)


def scan_points(path: str | os.PathLike[str]) -> pl.LazyFrame:
    """Every stored point under a folder or URL (OUT, OUT/points or one study's folder),
    lazily, as readers see them (`read_view`: strings, Int64 bytes, whatever the parts' schema
    version)."""
    fs, files = part_files(path)
    if not files:
        shown = os.fspath(path) if is_url(path) else str(local_path(path))
        raise ValueError(f"points: no part-*.parquet files under {shown!r}")
    return scan_parts(files, filesystem=fs)


def scan_parts(files: Sequence[str | os.PathLike[str]], *, filesystem: Any = None) -> pl.LazyFrame:
    """The points of part files, lazily, as readers see them (`read_view`). Parts of one
    schema are scanned together; parts of several (a folder written before and after a
    schema change) are each brought to READ_SCHEMA's dtypes, then concatenated.
    `filesystem`: the pyarrow filesystem of the files (`part_files`; None: local paths)."""
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for f in (os.fspath(file) for file in files):
        try:
            schema = _part_schema(f, filesystem)
        except (OSError, pl.exceptions.PolarsError) as error:
            message = " ".join(str(error).split())[:200]
            raise ValueError(f"points: {f}: unreadable part: {message}") from None
        groups.setdefault(tuple((k, str(v)) for k, v in schema.items()), []).append(f)
    frames = [read_view(_scan_group(group, filesystem)) for group in groups.values()]
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical")


def _part_schema(file: str, filesystem: Any) -> Mapping[str, Any]:
    """A part's polars schema (a URL's from its footer only)."""
    if filesystem is None:
        return pl.read_parquet_schema(Path(file))
    import pyarrow.lib
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(file, filesystem=filesystem)
    except pyarrow.lib.ArrowInvalid as error:  # not Parquet
        raise OSError(str(error)) from None
    return pl.from_arrow(schema.empty_table()).schema  # type: ignore[union-attr]


def _scan_group(files: list[str], filesystem: Any) -> pl.LazyFrame:
    """Parts of one schema, lazily: polars' scan of local paths; a pyarrow dataset on a
    URL's filesystem (any store pyarrow or fsspec opens, with its own credentials)."""
    if filesystem is None:
        return pl.scan_parquet(files)
    import pyarrow.dataset as ds

    return pl.scan_pyarrow_dataset(ds.dataset(files, filesystem=filesystem, format="parquet"))


def read_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The key-value metadata of one part (a path or a URL): trainmem_version,
    trainmem_schema_version, trainmem_study, trainmem_trial, trainmem_store (what the part holds
    of the points it covers: sweep/_options.py STORE_MODES; absent before schema 4: all) and,
    for a sweep's part, trainmem_space_fingerprint and trainmem_point_range (its chunk: flat
    indices LO-HI)."""
    if is_url(path):
        fs, file = url_filesystem(os.fspath(path))
        with fs.open_input_file(file) as fh:
            return pl.read_parquet_metadata(io.BytesIO(fh.readall()))
    return pl.read_parquet_metadata(local_path(path))
