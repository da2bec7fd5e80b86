"""The Optuna search: batched ask/tell over the vectorized engine, every trial's points stored.

A trial samples a layout (the outer axes); its inner points (INNER_AXES) are enumerated, so a
batch of B trials is one engine call over B x K points, written as one Parquet part. The points
table is the study's record (`_study`): a study resumes, in memory or on a database, from it.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
import warnings
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from trainmem.results import scan_points, study_dir, write_points
from trainmem.results._store import (
    HOST_TAG,
    _pid_alive,
    clean_temporaries,
    is_url,
    publish_points,
    staged_parts,
)

from ._axes import CATEGORICAL_AXES, INNER_AXES
from ._bounds import bounded_trials, fresh_trials
from ._cluster import check_cluster_storage, executor, parse_scheduler, shared_out
from ._points import (
    OBJECTIVES,
    PROCESS_START,
    TOP,
    Progress,
    SearchResult,
    _best_of,
    _best_rows,
    _frame,
    _pareto,
    _sort_keys,
)
from ._space import _NAMES, AXES, POINT_COLUMNS, Space, evaluate_columns

INFEASIBLE_VALUE = 1e12
"""Objective value told for an invalid layout (its time and cost are NaN); the `fits`
constraint already marks the trial infeasible."""


def _constraint(res: dict[str, np.ndarray]) -> np.ndarray:
    """> 0 where a point does not fit: GiB over the limit (`--lengths`: the worst step's, the
    limit being the peak plus its headroom), or 1000 for an invalid layout."""
    over = np.maximum(-res["headroom_bytes"] / 2**30, 1e-3)
    if "worst_step_peak_device_bytes" in res:  # a dataset's risk decides what fits
        worst = np.asarray(res["worst_step_peak_device_bytes"], dtype=np.float64)
        limit = res["headroom_bytes"] + res["peak_device_bytes"]
        by_risk = np.clip((worst - limit) / 2**30, 1e-3, 1000.0)
        over = np.where(np.isnan(worst), over, by_risk)
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
        with _creation_lock(storage):
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


@contextlib.contextmanager
def _creation_lock(storage: str) -> Iterator[None]:
    """Hold an SQLite study's file lock (`_study.queue_lock`) while its storage is opened and
    its study created: Optuna creates a new file's tables and the study without a lock, and two
    sweeps starting on one new file raced ("table studies already exists", "UNIQUE constraint
    failed: alembic_version", 3 of 5 seen here). A folder that cannot hold the lock: one line
    naming --storage."""
    from ._study import queue_lock  # imported here: it builds on this module

    try:
        lock = queue_lock(storage)
        lock.__enter__()
    except OSError as error:
        raise ValueError(f"storage: {mask_url(storage)}: {error.strerror or error}") from None
    try:
        yield
    finally:
        lock.__exit__(None, None, None)


STORAGE_ERROR_MODULES = ("sqlalchemy", "sqlite3", "optuna", "psycopg", "pymysql", "MySQLdb")
"""Where a storage's own errors come from (a corrupted or full database, a lost server): one
line naming --storage, not a traceback (`storage_errors`)."""


@contextlib.contextmanager
def storage_errors(storage: str | None) -> Iterator[None]:
    """Turn a storage's own error raised while a study runs (STORAGE_ERROR_MODULES, or text of
    a damaged file that is not UTF-8) into one ValueError naming --storage (password masked)."""
    try:
        yield
    except ValueError as error:
        if not isinstance(error, UnicodeDecodeError):
            raise
        raise ValueError(f"storage: {_where(storage)}damaged: {error}") from None
    except Exception as error:
        if not type(error).__module__.startswith(STORAGE_ERROR_MODULES):
            raise
        message = " ".join(str(error).split())[:200]
        raise ValueError(f"storage: {_where(storage)}{mask_url(message)}") from None


def _where(storage: str | None) -> str:
    return f"{mask_url(storage)}: " if storage and storage != ":memory:" else ""


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
                    space,
                    st,
                    batch,
                    inner=inner,
                    out=out,
                    study=study,
                    objectives=objectives,
                    seed=seed,
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
    seed: int | None = None,
) -> int:
    """Evaluate, stage, tell and publish one batch of trials; returns the points written.
    A trial whose layout another trial has (or is evaluating) is told FAIL unevaluated and
    replaced by a new layout (`_bounds.fresh_trials`)."""
    outer = {a: _suggest(space, a, batch) for a in AXES if a not in INNER_AXES}
    fresh = np.array(fresh_trials(space, st, batch, seed=seed), dtype=bool)
    if not fresh.all():
        batch = [t for t, new in zip(batch, fresh, strict=True) if new]
        outer = {a: v[fresh] for a, v in outer.items()}
    if not batch:
        return 0
    b, k = len(batch), len(next(iter(inner.values())))
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
    start = time.perf_counter()
    address = _check_optuna(
        out, trials=trials, workers=workers, storage=storage, scheduler=scheduler
    )
    out = str(shared_out(out, address))
    trials = bounded_trials(space, trials)
    if progress is not None:
        progress(0, trials)  # the size it will take, before any trial
    with (
        _held_storage(out, study, storage=storage, workers=workers) as url,
        storage_errors(url),
    ):
        st = _open_study(url, study, objectives, seed)  # once, before the workers race
        job: dict[str, Any] = {
            "out": out,
            "study": study,
            "objectives": tuple(objectives),
            "trials": trials,
        }
        rebuilt, warm = _seed_study(st, space, warm_start=warm_start, **job)
        found = _run_workers(
            space,
            storage=url,
            seed=seed,
            workers=workers,
            batch_size=batch_size,
            progress=progress,
            scheduler=address,
            **job,
        )
    found.elapsed_s = time.perf_counter() - start
    found.extra.update(rebuilt_trials=rebuilt, warm_start_trials=warm)
    return found


@contextlib.contextmanager
def _held_storage(out: str, study: str, *, storage: str | None, workers: int) -> Iterator[str]:
    """The study's storage URL (`_study.resolve_storage`), held for one run: an in-memory
    study under its folder's lock (`_study.memory_lock`), new at the start (the points are the
    record, `_seed_study` rebuilds it) and dropped at the end."""
    from . import _study  # imported here: it builds on this module

    url = _study.resolve_storage(out, study, storage=storage, workers=workers)
    in_memory = url == _study.MEMORY
    with _study.memory_lock(out, study) if in_memory else contextlib.nullcontext():
        _MEMORY.pop(study, None)  # a new in-memory study each run: the points are the record
        try:
            yield url
        finally:
            if in_memory:
                _MEMORY.pop(study, None)


def _check_optuna(
    out: str | os.PathLike[str],
    *,
    trials: int,
    workers: int,
    storage: str | None,
    scheduler: str | None,
) -> str | None:
    """The cluster's scheduler address (None: local), once the arguments an Optuna study
    cannot run with are refused (ValueError)."""
    if trials < 1:
        raise ValueError(f"trials: must be >= 1, got {trials}")
    if workers < 1:
        raise ValueError(f"workers: must be >= 1, got {workers}")
    address = parse_scheduler(scheduler)
    if is_url(out):  # staged parts are published by a link: a folder's
        raise ValueError(f"out: --method optuna stores its points in a folder, not a URL ({out})")
    if address is not None:
        check_cluster_storage(storage)
    return address


def _seed_study(
    st: Any,
    space: Space,
    *,
    out: str,
    study: str,
    objectives: Sequence[str],
    trials: int,
    warm_start: bool,
) -> tuple[int, int]:
    """A study without trials: first rebuilt from the points stored under its folder, then,
    still empty, warm-started (`_study`). Returns the trials rebuilt and enqueued."""
    from . import _study  # imported here: it builds on this module

    rebuilt = warm = 0
    if not st.get_trials(deepcopy=False):
        rebuilt = _study.rebuild_study(st, space, out=out, study=study, objectives=objectives)
    if warm_start and not st.get_trials(deepcopy=False):
        warm = _study.enqueue_warm_start(
            st,
            space,
            objectives,
            study=study,
            num_trials=min(_study.WARM_START_TRIALS, trials),
        )
    return rebuilt, warm


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
