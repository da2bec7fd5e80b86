"""Search a space: exhaustive (exact optimum) or Optuna (batched ask/tell), every point stored.

Both evaluate points the same way (`Space.evaluate` / `evaluate_columns`: one vectorized engine
call per chunk or batch) and write every point, fitting or not, to the points table (the
exhaustive search: unless `store` keeps fewer, `_parts.stored_rows`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import polars as pl

from trainmem.engine import preload_kernel
from trainmem.results import (
    SCHEMA_VERSION,
    part_exists,
    points_frame,
    scan_points,
    study_dir,
    write_points,
)
from trainmem.results._store import (
    HOST_TAG,
    PendingPart,
    _pid_alive,
    clean_temporaries,
    is_url,
    publish_points,
    read_part,
    read_view,
    staged_parts,
    study_location,
    write_pending,
)

from ._axes import CATEGORICAL_AXES, INNER_AXES
from ._cluster import check_cluster_storage, executor, parse_scheduler, shared_out
from ._parts import PublishBatches, check_store, chunk_points, part_name, stored_rows
from ._space import _NAMES, ALL_REASONS, AXES, POINT_COLUMNS, Space, evaluate_columns

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


def space_fingerprint(space: Space, *, chunk_size: int) -> str:
    """A short hash of everything that decides a chunk's points (part names depend on it)."""
    desc = {
        "model": space.model.name,
        "num_parameters": space.model.num_parameters,
        "pools": [
            (p.gpu, p.num_nodes, p.gpus_per_node, p.price_per_hour_usd) for p in space.fleet.pools
        ],
        "axes": {k: list(v) for k, v in space.axes.items()},
        "fixed": space.fixed,
        "headroom": space.headroom,
        "host_memory_bytes": [
            space.host_memory_bytes or p.host_memory_per_node_bytes(space.gpus[p.gpu])
            for p in space.fleet.pools
        ],
        "chunk_size": chunk_size,
        "schema_version": SCHEMA_VERSION,
    }
    # Constraints that only mark points (the GPU-count axis carries --min-gpus), named only
    # when set: a sweep without them keeps the parts (and part names) it always had.
    if space.use_all_gpus:
        desc["use_all_gpus"] = True
    if space.max_step_time_s is not None:
        desc["max_step_time_s"] = space.max_step_time_s
    return hashlib.sha256(json.dumps(desc, sort_keys=True, default=str).encode()).hexdigest()[:10]


def run_exhaustive(
    space: Space,
    *,
    out: str | os.PathLike[str] | None,
    study: str,
    objectives: Sequence[str] = ("cost",),
    chunk_size: int = 100_000,
    jobs: int = 1,
    progress: Progress | None = None,
    top: int | None = TOP,
    distinct: Sequence[str] = (),
    tie_break: Sequence[str] = (),
    store: str = "all",
    scheduler: str | None = None,
) -> SearchResult:
    """Evaluate every point of `space`, chunk by chunk, each chunk one Parquet part; `jobs` > 1
    spreads the chunks over that many joblib processes, `scheduler` (a Dask scheduler's
    address, `_cluster.parse_scheduler`) over a cluster's workers, which write the parts to
    `out` themselves: a folder every worker sees at the same path, or a URL
    (results/_store.py).

    `chunk_size` 100,000: on a 2-core machine the engine runs ~2x faster per point on 100,000
    rows than on 1,000,000 (its temporaries stay in cache).

    A rerun skips the chunks already written (deterministic part names), so a killed sweep
    resumes without losing or duplicating points. Returns the exact optimum over fitting points.
    In one process a writer thread writes each part while the next chunk is evaluated; a chunk
    is reported to `progress` once its part is written, and a failed write is raised. Parts are
    written without an fsync each and published in batches (`_parts.PublishBatches`: at the
    end, every PUBLISH_EVERY_S, and on an error); results/_store.py says what a crash leaves.

    `out` None: nothing is written (the points live in memory only; `parquet` is ""). `top`:
    the best fitting points kept (None: all); `distinct`: columns of which each combination
    keeps only its best point (e.g. the layout columns); `tie_break`: columns that order the
    points the objectives and TIE_BREAK leave tied. `store`: what the parts keep (STORE_MODES,
    `_parts.stored_rows`); the result is the same whatever they keep. `extra["closest"]`: when
    nothing fits, the valid point nearest to fitting (lowest device peak / usable memory), else
    None; `extra["store"]`, `extra["num_points_stored"]`: the rows of the study's parts.
    """
    start = time.perf_counter()
    check_store(store)
    address = parse_scheduler(scheduler)
    if address is not None and jobs != 1:
        raise ValueError(f"scheduler: --jobs {jobs} is for local processes; drop it with a cluster")
    out = shared_out(out, address)
    total = space.num_points
    size = chunk_points(space, chunk_size=chunk_size, store=store)
    fp = space_fingerprint(space, chunk_size=size)
    folder = None if out is None else study_location(out, study)
    if out is not None and (is_url(out) or study_dir(out, study).is_dir()):
        clean_temporaries(out, study=study, before=PROCESS_START)
    chunks = [
        (part_name(fp, store=store, chunk=c), lo, min(lo + size, total))
        for c, lo in enumerate(range(0, total, size))
    ]
    keys = [*_sort_keys(objectives), *[k for k in tie_break if k not in _sort_keys(objectives)]]
    args: dict[str, Any] = {
        "out": out,
        "study": study,
        "objectives": tuple(objectives),
        "keys": keys,
        "top": top,
        "distinct": tuple(distinct),
        "store": store,
        "fingerprint": fp,
        "owner_pid": os.getpid(),  # worker processes name their temporaries after this run
        "owner_host": HOST_TAG,  # ... and a cluster's workers after its host
    }
    keep: list[pl.DataFrame] = []
    near: list[pl.DataFrame] = []
    skipped = num_stored = 0
    batches = PublishBatches()
    # One process: a writer thread writes chunk c's part (polars, outside the GIL) while chunk
    # c + 1 is evaluated; a chunk is reported done only once its part is written.
    # Several processes (local, or a cluster's: `_cluster.executor`) each write the parts of
    # the chunks they evaluate; their results come back in chunk order.
    parallel = address is not None or (jobs > 1 and len(chunks) > 1)
    with (
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainmem-write") as writer,
        executor(address, n_jobs=jobs) if parallel else contextlib.nullcontext() as pool,
    ):
        if pool is not None:
            from joblib import delayed

            results: Any = pool(
                delayed(_exhaustive_chunk)(space, part=part, lo=lo, hi=hi, **args)
                for part, lo, hi in chunks
            )
        else:
            results = (
                _exhaustive_chunk(space, part=part, lo=lo, hi=hi, writer=writer, **args)
                for part, lo, hi in chunks
            )
        in_flight: list[tuple[int, Written]] = []
        try:
            for (_, _, hi), (best_rows, closest, was_skipped, rows, written) in zip(
                chunks, results, strict=True
            ):
                keep.append(best_rows)
                near.append(closest)
                skipped += was_skipped
                num_stored += rows
                in_flight.append((hi, written))
                while len(in_flight) > 1:  # the newest part's write overlaps the next chunk
                    batches.add(_reported(*in_flight.pop(0), total=total, progress=progress))
            while in_flight:
                batches.add(_reported(*in_flight.pop(0), total=total, progress=progress))
        except BaseException:
            _publish_after_error(batches, [w for _, w in in_flight])
            raise
        batches.publish()
    fitting = pl.concat(keep) if keep else _frame(space, space.evaluate(np.arange(0)), study=study)
    top_rows = _best_of(fitting, keys=keys, top=top, distinct=tuple(distinct))
    best = _pareto(fitting, objectives) if len(fitting) else fitting
    nearest = _closest(space, pl.concat(near)) if near and not len(fitting) else None
    return SearchResult(
        best=_best_rows(best),
        top=read_view(top_rows),
        num_points=total,
        parquet="" if folder is None else folder,
        elapsed_s=time.perf_counter() - start,
        extra={
            "chunks_skipped": skipped,
            "closest": nearest.to_dicts()[0] if nearest is not None and len(nearest) else None,
            "store": store,
            "num_points_stored": num_stored,
        },
    )


Written: TypeAlias = "Future[PendingPart | None] | PendingPart | None"
"""A chunk's part: being written (the writer thread's), written (a worker process's, or in
line), or none (nothing to write, or put in place on an object store: nothing to publish)."""


def _reported(
    hi: int, written: Written, *, total: int, progress: Progress | None
) -> PendingPart | None:
    """Wait for a chunk's part to be written (its write error raised here), report the chunk,
    and return the part (to publish)."""
    part = _part(written)
    if progress is not None:
        progress(hi, total)
    return part


def _part(written: Written) -> PendingPart | None:
    return written.result() if isinstance(written, Future) else written


def _publish_after_error(batches: PublishBatches, in_flight: list[Written]) -> None:
    """On an error (or Ctrl-C): publish the parts written so far, those in flight once written,
    so that a rerun skips them. A failure here leaves them to the rerun: the error raised is
    the first one."""
    for written in in_flight:
        with contextlib.suppress(Exception):  # a failed write: no part
            batches.pending.extend(p for p in [_part(written)] if p is not None)
    with contextlib.suppress(OSError):
        batches.publish()


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


def _closest(space: Space, frame: pl.DataFrame) -> pl.DataFrame:
    """The valid row (no reason) with the lowest device peak / usable memory: nearest to fit."""
    usable = {p.gpu: float(space.gpus[p.gpu].usable_bytes) for p in space.fleet.pools}
    gpu = pl.col("gpu").cast(pl.String)
    ratio = pl.col("peak_device_bytes") / gpu.replace_strict(usable, default=None)
    valid = frame.filter(pl.col("reason") == "")
    nearest = valid.with_columns(_ratio=ratio).sort("_ratio", nulls_last=True, maintain_order=True)
    return read_view(nearest.head(1).drop("_ratio"))


def _exhaustive_chunk(
    space: Space,
    *,
    out: Any,
    study: str,
    part: str,
    lo: int,
    hi: int,
    objectives: tuple[str, ...],
    keys: list[str],
    top: int | None,
    distinct: tuple[str, ...],
    store: str = "all",
    fingerprint: str = "",
    owner_pid: int | None = None,
    owner_host: str | None = None,
    writer: Executor | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame, bool, int, Written]:
    """Evaluate one chunk and write its part (`stored_rows` of its points); or, when a previous
    run wrote the part, read it back (store all) or evaluate the chunk again without writing (a
    partial part cannot give the chunk's best and closest rows); `out` None: evaluate only.

    Returns its best fitting rows (`_best_of`, and its Pareto front for two objectives), its
    valid row nearest to fitting, whether its part was on disk, the rows the part holds, and
    the part (`write_pending`, published by the caller): being written by `writer`, else
    written before returning.
    """
    skipped = out is not None and part_exists(out, study=study, part=part)
    written: Written = None
    if skipped and store == "all":
        frame = stored = read_part(out, study=study, part=part)
    else:
        preload_kernel(space.num_points)  # this process evaluates many chunks: compiled loop
        res = space.evaluate(range(lo, hi), columns=POINT_COLUMNS)
        kept = _rows_needed(res, store="fits" if out is None else store)
        frame = _frame(space, res if kept is None else _take(res, kept), study=study)
        stored = stored_rows(frame, store=store, keys=keys)
        if out is not None and not skipped:
            write = functools.partial(
                write_pending,
                stored,
                out,
                study=study,
                part=part,
                provenance={
                    "store": store,
                    "space_fingerprint": fingerprint,
                    "point_range": f"{lo}-{hi}",
                },
                owner_pid=owner_pid,
                owner_host=owner_host,
            )
            written = writer.submit(write) if writer is not None else write()
    fitting = frame.filter(pl.col("fits"))
    best = _best_of(fitting, keys=keys, top=top, distinct=distinct)
    if len(objectives) > 1:
        best = pl.concat([best, _pareto(fitting, objectives)])
    closest = _closest(space, frame) if not len(fitting) else read_view(frame.head(0))
    return best, closest, skipped, 0 if out is None else len(stored), written


def _rows_needed(res: dict[str, np.ndarray], *, store: str) -> np.ndarray | None:
    """The points of an evaluated chunk that its frame needs (None: all): its part's
    (`--store`), its best (the fitting ones) and, when none fits, its closest (the valid ones).
    Building the frame of only those skips most of a chunk's conversion for a partial store or
    an unwritten sweep (fitting points are a few % of a space)."""
    if store == "all":
        return None
    fits = np.flatnonzero(res["fits"])
    return np.flatnonzero(res["reason"] == 0) if store == "valid" or not len(fits) else fits


def _take(res: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """The `rows` of an evaluated chunk's columns (constants kept as they are)."""
    n = len(res["fits"])
    return {k: v[rows] if isinstance(v, np.ndarray) and len(v) == n else v for k, v in res.items()}


# ---- Optuna ------------------------------------------------------------------------------------

INFEASIBLE_VALUE = 1e12
"""Objective value told for an invalid layout (its time and cost are NaN); the `fits`
constraint already marks the trial infeasible."""


def _constraint(res: dict[str, np.ndarray]) -> np.ndarray:
    """> 0 where a point does not fit: GiB over the limit, or 1000 for an invalid layout."""
    over = np.maximum(-res["headroom_bytes"] / 2**30, 1e-3)
    return np.where(res["fits"], 0.0, np.where(res["reason"] == 0, over, 1000.0))


def _sampler(seed: int | None, num_objectives: int) -> Any:
    import optuna

    if num_objectives > 1:
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=20)
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=10)


_MEMORY: dict[str, Any] = {}
"""The in-memory storage of each study running in this process (`storage=":memory:"`, the
default for one worker), by study name; run_optuna starts each run with a new one (rebuilt from
the points) and drops it at the end."""


_URL_SECRET = re.compile(r"(?P<head>://[^:/@?#\s]*:)[^@/\s]*@|(?P<key>[?&]password=)[^&\s]*")


def mask_url(text: str) -> str:
    """`text` with every URL password replaced by *** (postgresql://user:***@host/db, and a
    `password=` query argument): storage URLs are echoed in outputs and errors."""
    return _URL_SECRET.sub(lambda m: f"{m['head']}***@" if m["head"] else f"{m['key']}***", text)


def default_storage(out: str | os.PathLike[str]) -> str:
    """The SQLite file OUT/optuna.db: the storage of several worker processes given no
    --storage (one worker keeps its study in memory: `_study.resolve_storage`)."""
    Path(out).mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{Path(out).resolve() / 'optuna.db'}"


def _open_study(storage: str, study: str, objectives: Sequence[str], seed: int | None) -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    store: Any = storage
    if storage == ":memory:":
        store = _MEMORY.setdefault(study, optuna.storages.InMemoryStorage())
    try:
        if storage.startswith("sqlite:"):
            store = _sqlite_storage(storage)
        opened = optuna.create_study(
            storage=store,
            study_name=study,
            sampler=_sampler(seed, len(objectives)),
            directions=["minimize"] * len(objectives),
            load_if_exists=True,
        )
        if opened.metric_names is None:  # optuna-dashboard labels its plots with these
            with warnings.catch_warnings():  # experimental since Optuna 3.2, still in 5.0
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                opened.set_metric_names([OBJECTIVES[o] for o in objectives])
        return opened
    except (ImportError, ModuleNotFoundError) as error:  # e.g. no PostgreSQL driver
        raise ValueError(f"storage: {mask_url(str(error))}") from None
    except Exception as error:
        if type(error).__module__.startswith(("sqlalchemy", "optuna")):
            message = mask_url(" ".join(str(error).split()))[:200]
            raise ValueError(f"storage: {message}") from None
        raise


def _sqlite_storage(url: str) -> Any:
    """An RDB storage on an SQLite file in WAL mode with NORMAL sync (commits without an fsync
    each: ~10x faster asks and tells; a crash loses at most the last transactions, never
    corrupts) and a 60 s busy timeout for several worker processes."""
    import optuna
    from sqlalchemy import event

    storage = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})

    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    event.listen(storage.engine, "connect", _pragmas)
    storage.engine.dispose()  # later connections get the pragmas
    return storage


def _suggest(space: Space, axis: str, batch: list[Any]) -> np.ndarray:
    values = space.axes[axis]
    if axis in CATEGORICAL_AXES:
        picked = [t.suggest_categorical(axis, list(values)) for t in batch]
        return np.array(picked, dtype=object if axis != "pool" else np.int64)
    if len(values) == 1:
        return np.full(len(batch), values[0], dtype=np.int64)
    index = [t.suggest_int(axis, 0, len(values) - 1) for t in batch]
    return np.asarray(values, dtype=np.int64)[index]


OWNER_ATTR = "trainmem_owner"
"""Trial user attribute: the worker that asked it (HOST_TAG-pid-token), set when the trial is
created, so that a resume can tell a dead worker's RUNNING trial from a live one's."""
FOREIGN_TRIAL_AGE_S = 3600.0
"""A RUNNING trial of another host (or with no owner) is failed once started this long ago: a
batch takes well under a minute, and another host's pids cannot be checked."""
POLL_S = 0.1
"""Wait between looks at the study while live workers hold every remaining trial."""
_LIVE_OWNERS: set[str] = set()
"""Owner tokens of the workers running in this process."""


def _new_owner() -> str:
    owner = f"{HOST_TAG}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    _LIVE_OWNERS.add(owner)
    return owner


def _owner_dead(trial: Any, now: float) -> bool:
    """Whether a RUNNING trial's worker is gone (its trial will never be told)."""
    owner = trial.user_attrs.get(OWNER_ATTR)
    host, pid = (owner.split("-")[:2] + [""])[:2] if isinstance(owner, str) else ("", "")
    if host == HOST_TAG and pid.isdigit():
        if int(pid) == os.getpid():
            return owner not in _LIVE_OWNERS
        return not _pid_alive(int(pid))
    started = trial.datetime_start.timestamp() if trial.datetime_start else now
    return now - started > FOREIGN_TRIAL_AGE_S


def _ask(st: Any, owner: str, *, pop: bool = False, storage: str = "") -> Any:
    """`study.ask()` with the owner attribute stored with the trial in one transaction (a
    worker killed right after an ask leaves a trial that names it).

    `pop`: first take an enqueued (WAITING) trial, as `study.ask()` does (`_pop_waiting`);
    `storage`: the study's URL, for its queue_lock.
    """
    import optuna
    from optuna.trial import FrozenTrial, TrialState

    from ._study import queue_lock  # imported here: it builds on this module

    trial_id = None
    if pop:
        with queue_lock(storage):
            trial_id = _pop_waiting(st, owner)
    if trial_id is not None:
        st._thread_local.cached_all_trials = None
        return optuna.Trial(st, trial_id)

    template = FrozenTrial(
        number=-1,
        state=TrialState.RUNNING,
        value=None,
        datetime_start=datetime.now(),
        datetime_complete=None,
        params={},
        distributions={},
        user_attrs={OWNER_ATTR: owner},
        system_attrs={},
        intermediate_values={},
        trial_id=-1,
    )
    trial_id = st._storage.create_new_trial(st._study_id, template_trial=template)
    st._thread_local.cached_all_trials = None  # as study.ask: the sampler sees the study anew
    return optuna.Trial(st, trial_id)


def _pop_waiting(st: Any, owner: str) -> int | None:
    """An enqueued (WAITING) trial, now RUNNING and naming `owner`, or None.

    As Optuna's Study._pop_waiting_trial_id (optuna/study/study.py, 5.0), but the owner is set
    before the trial runs: a worker killed at any moment leaves it WAITING (taken again by the
    next worker) or RUNNING with a dead owner (failed by the resume at once), never RUNNING
    without an owner, which a resume would wait FOREIGN_TRIAL_AGE_S for (seen here: a SIGKILL
    between Optuna's pop and the owner). Set again once RUNNING: another worker may have named
    itself in between and lost the trial.
    """
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    waiting = st._storage.get_all_trials(st._study_id, deepcopy=False, states=(TrialState.WAITING,))
    for trial in waiting:
        try:
            st._storage.set_trial_user_attr(trial._trial_id, OWNER_ATTR, owner)
            if not st._storage.set_trial_state_values(trial._trial_id, state=TrialState.RUNNING):
                continue  # another worker runs it
            st._storage.set_trial_user_attr(trial._trial_id, OWNER_ATTR, owner)
        except UpdateFinishedTrialError:  # another worker ran it to the end meanwhile
            continue
        return int(trial._trial_id)
    return None


def _fail(st: Any, trial_id: int) -> None:
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    with contextlib.suppress(UpdateFinishedTrialError):  # told meanwhile
        st._storage.set_trial_state_values(trial_id, TrialState.FAIL)


def recover_study(st: Any, *, out: str, study: str) -> int:
    """Fail the RUNNING trials of dead workers, then settle the staged parts they left: keep
    the points of COMPLETE trials (published), drop the others. Returns the trials failed."""
    from optuna.trial import TrialState

    now = time.time()
    failed = 0
    for t in st.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if _owner_dead(t, now):
            _fail(st, t._trial_id)
            failed += 1
    if study_dir(out, study).is_dir():
        clean_temporaries(out, study=study, before=PROCESS_START)
        parts = staged_parts(out, study=study)
        if parts:
            states = {t.number: t.state for t in st.get_trials(deepcopy=False)}
            for part in parts:
                _settle(out, study=study, part=part, states=states)
    return failed


def _settle(out: str, *, study: str, part: str, states: dict[int, Any]) -> None:
    """Publish a staged part's points of COMPLETE trials and drop the rest; a part with a
    RUNNING trial (its live worker will settle it) is left."""
    from optuna.trial import TrialState

    staged = study_dir(out, study) / f".staged-{part}.parquet"
    try:
        frame = pl.read_parquet(staged)
    except FileNotFoundError:  # settled meanwhile by its worker or another recovery
        return
    numbers = frame["trial"].unique().to_list()
    if any(states.get(n) == TrialState.RUNNING for n in numbers):
        return
    keep = [n for n in numbers if states.get(n) == TrialState.COMPLETE]
    if len(keep) == len(numbers):
        publish_points(out, study=study, part=part)
        return
    if keep:
        kept = frame.filter(pl.col("trial").is_in(keep))
        write_points(kept, out, study=study, part=part, trial=f"{min(keep)}-{max(keep)}")
    staged.unlink(missing_ok=True)


def _within_total(st: Any, batch: list[Any], trials: int) -> list[Any]:
    """The trials of `batch` among the study's first `trials` live ones (COMPLETE or RUNNING,
    by number); the others (asked concurrently by another worker) are told FAIL unevaluated.

    Never more than `trials` complete: a trial is kept only if fewer than `trials` trials
    before it are live, and a trial never returns to live once failed."""
    from optuna.trial import TrialState

    live = sorted(
        t.number
        for t in st.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
    )
    rank = {n: i for i, n in enumerate(live)}
    kept = []
    for t in batch:
        if rank.get(t.number, trials) < trials:
            kept.append(t)
        else:
            st.tell(t, state=TrialState.FAIL, skip_if_finished=True)
    return kept


def optuna_worker(
    space: Space,
    *,
    out: str,
    study: str,
    storage: str,
    trials: int,
    objectives: Sequence[str],
    seed: int | None,
    batch_size: int = 8,
    progress: Progress | None = None,
) -> int:
    """Ask/tell batches until the study holds `trials` complete trials; returns points written.

    Each batch: ask B trials (layouts, B at most the trials no live worker holds), one
    vectorized evaluation of their B x K points (K: the INNER_AXES product), write them as one
    staged Parquet part named by their trial numbers, tell B results (each layout's best
    fitting point) with the `fits` constraint, then publish the part: a stored point's trial is
    COMPLETE. A resume first fails dead workers' RUNNING trials and settles their staged parts
    (`recover_study`); while live workers hold every remaining trial, it waits for them.
    """
    from optuna.trial import TrialState

    st = _open_study(storage, study, objectives, seed)
    owner = _new_owner()
    try:
        recover_study(st, out=out, study=study)
        inner = {
            a: np.asarray(v, dtype=object if a in _NAMES else np.int64)
            for a, v in _inner_product(space).items()
        }
        written = 0
        while True:
            known = st.get_trials(
                deepcopy=False,
                states=(TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING),
            )
            live = [t for t in known if t.state != TrialState.WAITING]
            queued = len(known) - len(live)  # enqueued (warm start): asked before new ones
            done = sum(t.state == TrialState.COMPLETE for t in live)
            if progress is not None:
                progress(min(done, trials), trials)
            if done >= trials:
                return written
            free = trials - len(live)
            if free <= 0:
                if not recover_study(st, out=out, study=study):
                    time.sleep(POLL_S)
                continue
            batch = [
                _ask(st, owner, pop=i < queued, storage=storage)
                for i in range(min(batch_size, free))
            ]
            batch = _within_total(st, batch, trials)
            if batch:
                written += _run_batch(
                    space, st, batch, inner=inner, out=out, study=study, objectives=objectives
                )
    finally:
        _LIVE_OWNERS.discard(owner)


def _run_batch(
    space: Space,
    st: Any,
    batch: list[Any],
    *,
    inner: dict[str, np.ndarray],
    out: str,
    study: str,
    objectives: Sequence[str],
) -> int:
    """Evaluate, stage, tell and publish one batch of trials; returns the points written."""
    b, k = len(batch), len(next(iter(inner.values())))
    outer = {a: _suggest(space, a, batch) for a in AXES if a not in INNER_AXES}
    cols = {
        **{a: np.repeat(v, k) for a, v in outer.items()},
        **{a: np.tile(v, b) for a, v in inner.items()},
    }
    res = evaluate_columns(space, cols, columns=POINT_COLUMNS)
    numbers = np.array([t.number for t in batch], dtype=np.int64)
    frame = _frame(space, res, study=study, trial=np.repeat(numbers, k))
    part = f"t{numbers.min():08d}-{numbers.max():08d}"
    write_points(
        frame, out, study=study, part=part, trial=f"{numbers.min()}-{numbers.max()}", staged=True
    )
    # Per trial: its best fitting inner point (by the first objective, then cost); within
    # one layout num_gpus is fixed, so cost and time rank the inner points alike.
    keys = [OBJECTIVES[o] for o in objectives] + ["cost_per_million_tokens"]
    fits = res["fits"].reshape(b, k)
    rank = _argbest(res, keys, fits)
    constraint = _constraint(res).reshape(b, k).min(axis=1)
    for i, t in enumerate(batch):
        t.set_constraint("fits", float(constraint[i]))
        j = i * k + rank[i]
        values = []
        for o in objectives:
            v = float(res[OBJECTIVES[o]][j])
            values.append(v if np.isfinite(v) and fits[i, rank[i]] else INFEASIBLE_VALUE)
        for a in INNER_AXES:
            t.set_user_attr(a, _jsonable_item(cols[a][j]))
        st.tell(t, values if len(values) > 1 else values[0])
    publish_points(out, study=study, part=part)
    return b * k


def _inner_product(space: Space) -> dict[str, np.ndarray]:
    grids = np.meshgrid(*[np.arange(len(space.axes[a])) for a in INNER_AXES], indexing="ij")
    return {
        a: np.asarray(space.axes[a], dtype=object)[g.ravel()]
        for a, g in zip(INNER_AXES, grids, strict=True)
    }


def _argbest(res: dict[str, np.ndarray], keys: list[str], fits: np.ndarray) -> np.ndarray:
    """Per trial (row of `fits`), the index of its best fitting point (lexicographic `keys`)."""
    b, k = fits.shape
    order = np.lexsort([np.where(fits, res[c].reshape(b, k), np.inf) for c in keys[::-1]], axis=-1)
    return order[:, 0]


def _jsonable_item(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def run_optuna(
    space: Space,
    *,
    out: str | os.PathLike[str],
    study: str,
    trials: int,
    objectives: Sequence[str] = ("cost",),
    seed: int | None = 0,
    storage: str | None = None,
    workers: int = 1,
    batch_size: int = 8,
    warm_start: bool = True,
    progress: Progress | None = None,
    scheduler: str | None = None,
) -> SearchResult:
    """An Optuna study over `space` (TPE, NSGA-II for several objectives), `trials` in total.

    Rerunning continues the study until it holds `trials` complete trials. `workers` > 1 runs
    that many joblib processes on the same storage (seeds seed, seed+1, ...). `storage` None:
    in memory for one worker (OUT/optuna.db for several, or when it holds the study:
    `_study.resolve_storage`); a study without trials is first rebuilt from the points stored
    under its folder (`_study.rebuild_study`), so an in-memory study continues too.
    `warm_start`: a new study's first trials are the best layouts of the exhaustive search of
    a coarse version of the space (`_study.enqueue_warm_start`), stored like any trial.
    `extra`: complete_trials, storage (password masked), rebuilt_trials, warm_start_trials.
    `scheduler`: a Dask scheduler's address (`_cluster.parse_scheduler`): the `workers` run on
    the cluster, sharing the study through `storage` (a database server's URL) and the points
    through `out` (a folder every node sees at the same path).
    """
    from . import _study  # imported here: it builds on this module

    if trials < 1:
        raise ValueError(f"trials: must be >= 1, got {trials}")
    if workers < 1:
        raise ValueError(f"workers: must be >= 1, got {workers}")
    start = time.perf_counter()
    address = parse_scheduler(scheduler)
    if is_url(out):  # staged parts are published by a link: a folder's
        raise ValueError(f"out: --method optuna stores its points in a folder, not a URL ({out})")
    if address is not None:
        check_cluster_storage(storage)
    out = str(shared_out(out, address))
    url = _study.resolve_storage(out, study, storage=storage, workers=workers)
    in_memory = url == _study.MEMORY
    with _study.memory_lock(out, study) if in_memory else contextlib.nullcontext():
        _MEMORY.pop(study, None)  # a new in-memory study each run: the points are the record
        try:
            st = _open_study(url, study, objectives, seed)  # once, before the workers race
            rebuilt = warm = 0
            if not st.get_trials(deepcopy=False):
                rebuilt = _study.rebuild_study(
                    st, space, out=out, study=study, objectives=objectives
                )
            if warm_start and not st.get_trials(deepcopy=False):
                warm = _study.enqueue_warm_start(
                    st,
                    space,
                    objectives,
                    study=study,
                    num_trials=min(_study.WARM_START_TRIALS, trials),
                )
            found = _run_workers(
                space,
                out=out,
                study=study,
                storage=url,
                trials=trials,
                objectives=tuple(objectives),
                seed=seed,
                workers=workers,
                batch_size=batch_size,
                progress=progress,
                scheduler=address,
            )
        finally:
            if in_memory:
                _MEMORY.pop(study, None)
    found.elapsed_s = time.perf_counter() - start
    found.extra.update(rebuilt_trials=rebuilt, warm_start_trials=warm)
    return found


def _run_workers(
    space: Space,
    *,
    out: str,
    study: str,
    storage: str,
    trials: int,
    objectives: tuple[str, ...],
    seed: int | None,
    workers: int,
    batch_size: int,
    progress: Progress | None,
    scheduler: str | None = None,
) -> SearchResult:
    """Run the workers (here, local processes, or a cluster's: `scheduler`) until the study
    holds `trials` complete trials; the study's best point(s) and top points, read from the
    points of its complete trials."""
    kwargs: dict[str, Any] = {
        "out": out,
        "study": study,
        "storage": storage,
        "trials": trials,
        "objectives": objectives,
        "batch_size": batch_size,
    }
    if workers == 1 and scheduler is None:
        optuna_worker(space, seed=seed, progress=progress, **kwargs)
    else:
        from joblib import delayed

        with executor(scheduler, n_jobs=workers, batch_size=1) as pool:
            for _ in pool(
                delayed(optuna_worker)(space, seed=None if seed is None else seed + w, **kwargs)
                for w in range(workers)
            ):
                pass
    st = _open_study(storage, study, objectives, seed)
    recover_study(st, out=out, study=study)
    folder = study_dir(out, study)
    complete = [t.number for t in st.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    # Parts written before points were staged may hold points of failed trials: not counted.
    # scan_points: strings, whatever the parts' schema versions (a study resumed across them).
    points = scan_points(folder).filter(pl.col("trial").is_in(complete))
    fitting = points.filter(pl.col("fits")).collect()
    fitting = fitting.sort(_sort_keys(objectives), maintain_order=True)
    distinct = fitting.unique(subset=list(AXES[1:]) + ["gpu"], keep="first", maintain_order=True)
    top = _best_of(distinct, keys=_sort_keys(objectives), top=TOP, distinct=())
    best = _pareto(fitting, objectives) if len(fitting) else fitting
    num_points = points.select(pl.len()).collect().item()
    return SearchResult(
        best=_best_rows(best),
        top=top,
        num_points=int(num_points),
        parquet=str(folder),
        elapsed_s=0.0,
        extra={"complete_trials": len(complete), "storage": mask_url(storage), "study": study},
    )
