"""An Optuna study's keeping: where it is stored, its rebuild from the points table, its warm
start.

The points table is a study's record: every point of every COMPLETE trial is stored (a batch's
part is published once the batch is told), so a study can be rebuilt from it. That is what lets
the default storage be in memory, with no database round trip per ask and tell (SQLite costs
~20 ms per trial, more than TPE's own ~5 ms), while a rerun, or a resume after a kill, still
continues the study as an SQLite one does. A warm start runs the exhaustive search of a coarse
version of the space (`coarse_space`), then of the cell around its optimum (`zoomed_space`), and
enqueues the best layouts as the study's first trials.

`run_optuna` (in _optuna) imports this module when it runs, since this module builds on
_optuna's trial mapping (INNER_AXES, the told value and constraint).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from trainmem.results import scan_points, study_dir
from trainmem.results._store import HOST_TAG

from ._axes import CATEGORICAL_AXES, INNER_AXES
from ._exhaustive import run_exhaustive
from ._optuna import INFEASIBLE_VALUE, _constraint, default_storage
from ._points import OBJECTIVES, SearchResult, _sort_keys
from ._space import AXES, Space, coarse_space, zoomed_space

MEMORY = ":memory:"
"""The storage URL of an in-memory study: the default for one worker process."""
LOCK_NAME = ".optuna-memory.lock"
"""The file in the study's folder an in-memory run holds an advisory lock on."""
WARM_START_TRIALS = 8
"""Coarse-optimum layouts enqueued: one batch (the default batch size). TPE ranks a study's
best ~10% of trials as its "good" set, so these decide where its first draws go."""
WARM_START_ATTR = "trainmem_warm_start"
"""Trial user attribute: True on a trial enqueued by the warm start."""
OUTER_AXES = tuple(a for a in AXES if a not in INNER_AXES)
"""The axes of a layout, which a trial samples (the inner ones it enumerates)."""
LAYOUT_COLUMNS = ("gpu", *OUTER_AXES[1:])
"""A layout's columns in the points table (the pool stored by its GPU's name)."""


def resolve_storage(
    out: str | os.PathLike[str], study: str, *, storage: str | None, workers: int
) -> str:
    """The study's storage URL: `storage` when given; else in memory, or the SQLite file
    OUT/optuna.db when several worker processes share the study (they need a database) or
    when that file already holds it (begun with --workers, or by a version whose default it
    was: its trials continue there). ValueError for an in-memory study with several workers.

    Source: Optuna's InMemoryStorage "stores data in memory of the Python process"
    (https://optuna.readthedocs.io/en/stable/reference/generated/optuna.storages.InMemoryStorage.html);
    processes share a study through "the same storage backend, such as RDB or a file"
    (https://optuna.readthedocs.io/en/latest/tutorial/10_key_features/004_distributed.html).
    """
    if storage == MEMORY and workers > 1:
        raise ValueError(
            f"storage: an in-memory study serves one process; --workers {workers} needs "
            "--storage URL (sqlite:///FILE or postgresql://...), or no --storage for "
            "OUT/optuna.db"
        )
    if storage:
        return storage
    if workers > 1 or _sqlite_holds(Path(out) / "optuna.db", study):
        return default_storage(out)
    return MEMORY


def _sqlite_holds(path: Path, study: str) -> bool:
    """Whether the SQLite file at `path` holds a study named `study` (True when it cannot be
    read: the file then stays the study's storage, as before, and Optuna reports its error).

    Source: optuna/storages/_rdb/models.py (5.0), StudyModel: table `studies`, column
    `study_name`.
    """
    if not path.is_file():
        return False
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=60)) as db:
            query = "SELECT 1 FROM studies WHERE study_name = ?"
            return db.execute(query, (study,)).fetchone() is not None
    except sqlite3.Error:
        return True


@contextlib.contextmanager
def memory_lock(out: str | os.PathLike[str], study: str) -> Iterator[None]:
    """Hold the study for this process while its in-memory study runs; ValueError (one line
    naming --storage) when another process holds it.

    A second process would rebuild the same trials from the same points and number its new
    trials alike: its parts would take our parts' names (a part is written once, the first
    kept) and its points would be lost. The lock is advisory (flock): the kernel releases it
    when its process dies, so a killed run's file is simply reused by the next run.
    """
    import fcntl

    folder = study_dir(out, study)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace") or "another process"
            os.close(fd)
            raise ValueError(
                f"storage: study {study!r} is being searched in memory by {holder}; several "
                f"processes on one study need --storage (e.g. sqlite:///"
                f"{Path(out).resolve() / 'optuna.db'})"
            ) from None
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        os.close(fd)  # its holder removed it between our open and lock: lock the new file
    os.ftruncate(fd, 0)
    os.write(fd, f"{HOST_TAG}-{os.getpid()}".encode())
    try:
        yield
    finally:
        path.unlink(missing_ok=True)  # before the lock is released (see the inode check)
        os.close(fd)


# ---- a layout as Optuna parameters -------------------------------------------------------------


def distributions(space: Space) -> dict[str, Any]:
    """The distribution of each parameter `_suggest` draws: the pool as a category, each other
    layout axis with more than one value as an index into its values. Equal to the drawn ones,
    or Optuna refuses a rebuilt trial beside a new one."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    out: dict[str, Any] = {}
    for axis in OUTER_AXES:
        values = space.axes[axis]
        if axis in CATEGORICAL_AXES:
            out[axis] = CategoricalDistribution(list(values))
        elif len(values) > 1:
            out[axis] = IntDistribution(0, len(values) - 1)
    return out


def layout_params(space: Space, row: dict[str, Any]) -> dict[str, int]:
    """The Optuna parameters of a stored point's layout (LAYOUT_COLUMNS of `row`); ValueError
    when the space does not search one of its values (the study was of another space)."""
    params = {"pool": _pool_index(space, row["gpu"], row["num_gpus"])}
    for axis in OUTER_AXES[1:]:
        values = space.axes[axis]
        if row[axis] not in values:
            raise ValueError(
                f"study: its stored points have {axis} {row[axis]}, which this sweep does not "
                "search; give the sweep a new --study-name"
            )
        if len(values) > 1:
            params[axis] = values.index(row[axis])
    return params


def _pool_index(space: Space, gpu: str, num_gpus: int) -> int:
    """The pool of a stored point, which the table names by GPU: the first pool of that GPU
    holding `num_gpus` GPUs, else the first of that GPU.

    Assumes: one pool per GPU type. Two pools of one type differ in size and price only; a
    rebuilt trial may then name the other, which changes the sampler's history, never the
    stored points or the result.
    """
    pools = [i for i, p in enumerate(space.fleet.pools) if p.gpu == gpu]
    if not pools:
        raise ValueError(
            f"study: its stored points are on {gpu}, which this fleet lacks; give the sweep a "
            "new --study-name"
        )
    return next((i for i in pools if space.fleet.pools[i].num_gpus >= num_gpus), pools[0])


# ---- rebuild -----------------------------------------------------------------------------------


def rebuild_study(st: Any, space: Space, *, out: str, study: str, objectives: Sequence[str]) -> int:
    """Add to a study without trials the trials its published points record; returns the
    COMPLETE trials added.

    Each comes back whole: its layout (parameters), its value (its best fitting point's
    objectives, INFEASIBLE_VALUE when none fits, as `_run_batch` tells it), its `fits`
    constraint and its best point's inner axes. Numbers without points (trials failed, or
    asked and never published) come back as FAIL trials, so that new trials continue the
    numbering and their parts never take a stored part's name.

    Source: `Study.add_trials` and `optuna.trial.create_trial` (its `constraints` argument:
    optuna/trial/_frozen.py, 5.0)
    (https://optuna.readthedocs.io/en/stable/reference/generated/optuna.study.Study.html).
    """
    from optuna.trial import TrialState, create_trial

    folder = study_dir(out, study)
    if not any(folder.glob("part-t*.parquet")):
        return 0
    wanted = [*LAYOUT_COLUMNS, *INNER_AXES, "fits", "reason", "peak_device_bytes"]
    wanted += [OBJECTIVES[o] for o in objectives] + ["cost_per_million_tokens", "trial"]
    if space.risk is not None:
        wanted.append("worst_step_peak_device_bytes")
    points = scan_points(folder).filter(pl.col("trial").is_not_null())
    summary = _trial_summary(
        space, points.select(list(dict.fromkeys(wanted))).collect(), objectives
    )
    dists = distributions(space)
    by_number = {row["trial"]: row for row in summary.iter_rows(named=True)}
    trials = []
    for number in range(max(by_number) + 1):
        row = by_number.get(number)
        if row is None:
            trials.append(create_trial(state=TrialState.FAIL))
            continue
        params = layout_params(space, row)
        values = [
            float(row[OBJECTIVES[o]]) if row["fits"] else INFEASIBLE_VALUE for o in objectives
        ]
        trials.append(
            create_trial(
                values=values,
                params=params,
                distributions={k: dists[k] for k in params},
                user_attrs={a: row[a] for a in INNER_AXES},
                constraints={"fits": row["constraint"]},
            )
        )
    st.add_trials(trials)
    return len(by_number)


def _trial_summary(space: Space, points: pl.DataFrame, objectives: Sequence[str]) -> pl.DataFrame:
    """One row per trial: its best point (fitting first, then by the objectives and cost,
    as `_argbest`) and `constraint`, the least `_constraint` of its points."""
    usable = {p.gpu: float(space.gpus[p.gpu].usable_bytes) for p in space.fleet.pools}
    # A GPU the fleet lacks: no limit here; layout_params then names it.
    per_point = points["gpu"].cast(pl.String).replace_strict(usable, default=np.inf)
    limit = per_point.to_numpy() * (1.0 - space.headroom)
    res = {
        "headroom_bytes": limit - points["peak_device_bytes"].to_numpy(),
        "fits": points["fits"].to_numpy(),
        "reason": (points["reason"] != "").cast(pl.Int8).to_numpy(),
    }
    if space.risk is not None:  # `--lengths`: the worst step's distance, as told live
        res["peak_device_bytes"] = points["peak_device_bytes"].cast(pl.Float64).to_numpy()
        worst = points["worst_step_peak_device_bytes"].cast(pl.Float64)
        res["worst_step_peak_device_bytes"] = worst.fill_null(np.nan).to_numpy()
    keys = [OBJECTIVES[o] for o in objectives] + ["cost_per_million_tokens"]
    ranked = points.with_columns(constraint=pl.Series(_constraint(res))).sort(
        ["trial", "fits", *keys], descending=[False, True, *[False] * len(keys)], nulls_last=True
    )
    return ranked.group_by("trial", maintain_order=True).agg(
        pl.exclude("constraint").first(), pl.col("constraint").min()
    )


# ---- warm start --------------------------------------------------------------------------------


def warm_start_params(
    space: Space, objectives: Sequence[str], *, study: str, num_trials: int
) -> list[dict[str, int]]:
    """The Optuna parameters of the best distinct layouts found coarse to fine, at most
    `num_trials`, best first: the exhaustive search of `coarse_space`, then of the cell around
    its optimum (`zoomed_space`); two objectives: their Pareto fronts first. None when nothing
    in the coarse space fits. These points are not stored: the layouts enqueued are, as trials.
    """
    coarse = coarse_space(space)
    found = _best_layouts(coarse, objectives, study=study, num_trials=num_trials)
    if not found.best:
        return []
    near = _best_layouts(
        zoomed_space(space, coarse, found.best[0]), objectives, study=study, num_trials=num_trials
    )
    ranked = pl.concat([near.top, found.top]).sort(_sort_keys(objectives), maintain_order=True)
    params: list[dict[str, int]] = []
    for row in [*near.best, *found.best, *ranked.to_dicts()]:
        p = layout_params(space, row)
        if p not in params:
            params.append(p)
    return params[:num_trials]


def _best_layouts(
    space: Space, objectives: Sequence[str], *, study: str, num_trials: int
) -> SearchResult:
    """The exhaustive search of `space`, nothing written, its best point per layout kept."""
    return run_exhaustive(
        space,
        out=None,
        study=study,
        objectives=objectives,
        top=num_trials,
        distinct=LAYOUT_COLUMNS,
    )


def enqueue_warm_start(
    st: Any, space: Space, objectives: Sequence[str], *, study: str, num_trials: int
) -> int:
    """Enqueue the coarse optimum's layouts as the study's first trials (WARM_START_ATTR set);
    returns how many.

    Source: `Study.enqueue_trial(params, user_attrs, skip_if_exists)`: "fix the next sampling
    parameters"; an enqueued trial waits until asked
    (https://optuna.readthedocs.io/en/stable/reference/generated/optuna.study.Study.html).
    """
    params = warm_start_params(space, objectives, study=study, num_trials=num_trials)
    for p in params:
        st.enqueue_trial(p, user_attrs={WARM_START_ATTR: True}, skip_if_exists=True)
    return len(params)


QUEUE_LOCK_SUFFIX = "-queue.lock"
"""The lock file beside an SQLite study's database (as SQLite's own -wal and -shm files)."""


@contextlib.contextmanager
def queue_lock(storage: str) -> Iterator[None]:
    """Hold an SQLite study's trial queue while this process takes an enqueued trial (other
    storages: nothing to hold).

    Optuna's Study._pop_waiting_trial_id reads the WAITING trials, then sets one RUNNING; on
    SQLite (pysqlite opens no transaction for the read) two workers can both read it WAITING
    and both run it, the second then failing on "Trial#N has already finished" (seen here
    with two workers; Source: optuna/study/study.py and optuna/storages/_rdb/storage.py
    set_trial_state_values, 5.0). Workers on one SQLite file share its file system, so an
    advisory flock beside it serialises them; PostgreSQL's SELECT ... FOR UPDATE does it there.
    """
    import fcntl

    prefix = "sqlite:///"
    if not storage.startswith(prefix):
        yield
        return
    path = storage[len(prefix) :].split("?", 1)[0]  # the database file, less any query
    fd = os.open(path + QUEUE_LOCK_SUFFIX, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
