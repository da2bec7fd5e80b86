"""`trainmem sweep` as a function: a job's space on a fleet, searched exhaustively or by Optuna,
every point stored as Parquet under `out` (None: in memory).

`run_sweep` returns the search's objects (SweepRun); `sweep_report` returns the dict that
`trainmem sweep --json` prints (a SweepReport, which also carries the SweepRun's attributes).
Bad input raises ValueError (one line naming the field).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainmem.catalog import optimizer_columns
from trainmem.engine import (
    COMPONENTS,
    DEFAULTS_BY_FIELD,
    FIELD_NAMES,
    TrainingConfig,
)
from trainmem.hardware import load_gpus, parse_fleet
from trainmem.report import (
    check_headroom,
    check_options,
    choice,
    gib_to_bytes,
    jsonable,
    model_spec,
    training_config,
)

from ._axes import SHOW
from ._options import SEARCH_DEFAULTS, SWEEP_OPTIONS, extra_fields
from ._parts import check_store
from ._search import Progress, SearchResult, parse_objectives, run_exhaustive, run_optuna
from ._space import Space, make_space
from ._why import why


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepRun:
    """A finished sweep: its search result, the space searched, the study name, objectives."""

    result: SearchResult
    space: Space
    study: str
    objectives: tuple[str, ...]
    method: str = "exhaustive"
    """The search that ran: exhaustive or optuna."""
    why: dict[str, Any] | None = None
    """The best point's step-time parts next to the best conventional layout's (`_why.why`);
    None for a Pareto front or when nothing fits."""


def _constraints_text(min_gpus: int, use_all_gpus: bool, max_step_time_s: float | None) -> str:
    """``-min32-all-max20s``: the constraints a default study name carries when set, so that a
    sweep under other constraints is another study (an Optuna study rebuilt from its points
    would otherwise mix points judged under both)."""
    parts = [f"min{min_gpus}"] if min_gpus > 1 else []
    if use_all_gpus:
        parts.append("all")
    if max_step_time_s is not None:
        parts.append(f"max{max_step_time_s:g}s")
    return "".join(f"-{p}" for p in parts)


def _default_study(model: str, fleet: str, seq_len: int, gbs: int, method: str) -> str:
    name = f"{model}-{fleet}-s{seq_len}-g{gbs}-{method}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_.-")[:120] or "study"


def run_sweep(
    training: TrainingConfig | Mapping[str, Any] | None = None,
    *,
    model: str = "llama-3.1-8b",
    fleet: str = "8xh100-sxm-80gb",
    method: str = "exhaustive",
    trials: int = 200,
    seed: int = 0,
    objective: str = "cost",
    storage: str | None = None,
    study_name: str | None = None,
    workers: int = 1,
    warm_start: bool = True,
    jobs: int = 1,
    scheduler: str | None = None,
    out: str | None = "out",
    store: str = "all",
    max_micro_batch_size: int = 16,
    max_pp: int = 16,
    max_cp: int = 4,
    host_memory_gib: float | None = None,
    min_gpus: int = 1,
    use_all_gpus: bool = False,
    max_step_time_s: float | None = None,
    headroom: float = 0.10,
    hardware_dir: str | None = None,
    models_dir: str | None = None,
    optimizers_dir: str | None = None,
    profile_file: str | None = None,
    family: str | None = None,
    progress: Progress | None = None,
    **fields: Any,
) -> SweepRun:
    """Search `fleet` for the best configurations of the job (SWEEP_OPTIONS).

    The job's training fields: `training` updated by keyword fields, over SEARCH_DEFAULTS; a
    searched field (SWEEP_AXES) given pins its axis, None leaves it searched.
    """
    defaults = {o.name: o.default for o in SWEEP_OPTIONS if o.name in FIELD_NAMES}
    training = training_config(training, fields, defaults={**DEFAULTS_BY_FIELD, **defaults})
    seq_len, global_batch_size = training["seq_len"], training["global_batch_size"]
    precision, optimizer, framework = (training[k] for k in ("precision", "optimizer", "framework"))
    choice("method", method, ("exhaustive", "optuna"))
    check_store(store)
    # precision and framework are judged once, with the other training fields, by
    # check_options (their closed vocabularies first) and, unset (None), by the engine's grid.
    optimizer_fields = optimizer_columns(optimizer, optimizers_dir)
    objectives = parse_objectives(objective)
    check_headroom(headroom)
    counts = {
        "trials": trials,
        "workers": workers,
        "jobs": jobs,
        "max_pp": max_pp,
        "max_cp": max_cp,
        "max_micro_batch_size": max_micro_batch_size,
    }
    check_options(
        SWEEP_OPTIONS,
        {
            **training,
            **counts,
            "headroom": headroom,
            "host_memory_gib": host_memory_gib,
            "min_gpus": min_gpus,
            "max_step_time_s": max_step_time_s,
        },
    )
    gpus = load_gpus(hardware_dir)
    spec = model_spec(model, models_dir=models_dir, profile_file=profile_file, family=family)
    if spec.profile is not None and precision not in (
        SEARCH_DEFAULTS["precision"],
        spec.profile.precision,
    ):
        raise ValueError(
            f"precision: --profile {profile_file} was traced with {spec.profile.precision}; "
            f"got --precision {precision}"
        )
    space = make_space(
        spec,
        parse_fleet(fleet, gpus),
        gpus,
        seq_len=seq_len,
        global_batch_size=global_batch_size,
        precision=precision,
        optimizer=optimizer_fields,
        framework=framework,
        max_micro_batch_size=max_micro_batch_size,
        max_pp=max_pp,
        max_cp=max_cp,
        headroom=headroom,
        training=extra_fields(training),
        optimizer_name=optimizer,
        host_memory_bytes=gib_to_bytes(host_memory_gib),
        min_gpus=min_gpus,
        use_all_gpus=use_all_gpus,
        max_step_time_s=max_step_time_s,
    )
    study = study_name or _default_study(
        spec.name,
        fleet,
        seq_len,
        global_batch_size,
        method + _constraints_text(min_gpus, use_all_gpus, max_step_time_s),
    )
    result = _search(
        space,
        method=method,
        out=out,
        study=study,
        objectives=objectives,
        trials=trials,
        seed=seed,
        storage=storage,
        workers=workers,
        warm_start=warm_start,
        jobs=jobs,
        store=store,
        progress=progress,
        scheduler=scheduler,
    )
    explained = None
    if len(objectives) == 1 and len(result.best) == 1:
        explained = why(space, result.best[0], objectives)
    return SweepRun(
        result=result,
        space=space,
        study=study,
        objectives=objectives,
        method=method,
        why=explained,
    )


def _search(
    space: Space,
    *,
    method: str,
    out: str | None,
    study: str,
    objectives: tuple[str, ...],
    trials: int,
    seed: int,
    storage: str | None,
    workers: int,
    jobs: int,
    warm_start: bool = True,
    store: str = "all",
    progress: Progress | None = None,
    scheduler: str | None = None,
) -> SearchResult:
    if method == "exhaustive":
        if storage or workers != 1:
            raise ValueError("--storage and --workers apply to --method optuna")
        return run_exhaustive(
            space,
            out=out,
            study=study,
            objectives=objectives,
            jobs=jobs,
            store=store,
            progress=progress,
            scheduler=scheduler,
        )
    if jobs != 1:
        raise ValueError("--jobs applies to --method exhaustive (optuna: --workers)")
    if store != "all":  # a study's best and top points are read back from all its points
        raise ValueError("--store applies to --method exhaustive (optuna stores every point)")
    if out is None:  # its workers share the points through the study's folder
        raise ValueError("out: --method optuna stores its points under a folder; got None")
    return run_optuna(
        space,
        out=out,
        study=study,
        trials=trials,
        objectives=objectives,
        seed=seed,
        storage=storage,
        workers=workers,
        warm_start=warm_start,
        progress=progress,
        scheduler=scheduler,
    )


class SweepReport(dict[str, Any]):
    """`trainmem sweep --json` as a dict (what the CLI prints, key for key), returned by
    `sweep_report` and `trainmem.sweep(...)`.

    It also answers the SweepRun's attributes (`result`, `space`, `study`, `method`,
    `objectives`, `why`): `trainmem.sweep()` returned the SweepRun before it returned the dict,
    and callers of that contract keep working; the CLI's human output reads them too.
    """

    __slots__ = ("run",)

    def __init__(self, payload: Mapping[str, Any], *, run: SweepRun) -> None:
        super().__init__(payload)
        self.run = run

    @property
    def result(self) -> SearchResult:
        return self.run.result

    @property
    def space(self) -> Space:
        return self.run.space

    @property
    def study(self) -> str:
        return self.run.study

    @property
    def method(self) -> str:
        return self.run.method

    @property
    def objectives(self) -> tuple[str, ...]:
        return self.run.objectives

    @property
    def why(self) -> dict[str, Any] | None:
        return self.run.why


def sweep_report(
    training: TrainingConfig | Mapping[str, Any] | None = None, **options: Any
) -> SweepReport:
    """`trainmem sweep --json`: `run_sweep(training, **options)` (every SWEEP_OPTIONS option,
    training fields by name, `progress`) as the JSON-able dict the command prints.

    `out` is checked before any point is computed (`check_out_dir`), and an OSError while the
    points are written is a one-line ValueError naming `out`, as every bad input is.
    """
    out = options.get("out", "out")
    if out is not None:
        check_out_dir(out)
    try:
        done = run_sweep(training, **options)
    except OSError as exc:  # the folder became unwritable, or a path under it is odd
        raise ValueError(f"out: {out!r}: {exc.strerror or exc}") from None
    return SweepReport(jsonable(sweep_payload(done)), run=done)


def sweep_payload(done: SweepRun) -> dict[str, Any]:
    """The keys of `trainmem sweep --json`, in their order: the study, the best point and the
    top ones (`point_json`), the why, the counts and where the points are; a Pareto front for
    several objectives. The search's extra facts follow (SearchResult.extra)."""
    result, objectives = done.result, done.objectives
    payload: dict[str, Any] = {
        "study": done.study,
        "method": done.method,
        "objective": list(objectives),
        "best": point_json(result.best[0]) if len(result.best) == 1 else None,
        "top": [point_json(row) for row in result.top.iter_rows(named=True)],
        "why": done.why,
        "num_points": result.num_points,
        "parquet": result.parquet,
        "elapsed_s": round(result.elapsed_s, 3),
        **{k: v for k, v in result.extra.items() if k != "study"},
    }
    if len(objectives) > 1:
        payload["pareto"] = [point_json(r) for r in result.best]
    return payload


def point_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """One point of the sweep's JSON: its configuration (the SHOW columns), fit, cost, time,
    peak and breakdown."""
    return jsonable(
        {
            "configuration": {k: row[k] for k in SHOW},
            "fits": row["fits"],
            "cost_per_million_tokens": row["cost_per_million_tokens"],
            "step_time_s": row["step_time_s"],
            "tokens_per_second": row["tokens_per_second"],
            "mfu": row["mfu"],
            "peak_device_bytes": row["peak_device_bytes"],
            "breakdown": {k: row[k] for k in COMPONENTS},
        }
    )


def check_out_dir(out: str) -> None:
    """ValueError ("out: ...") when the output folder names a file or cannot be created or
    written (checked before any point is computed). A URL (s3://...) is checked by its store
    when the first part is written; file:// is a path."""
    from trainmem.results._store import is_url, local_path

    if is_url(out):
        return
    path = local_path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"out: {out!r} is a file, not a folder")
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise ValueError(f"out: {str(existing)!r} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"out: {str(existing)!r} is not writable")
