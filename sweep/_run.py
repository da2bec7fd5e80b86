"""`trainmem sweep` as a function: a job's space on a fleet, searched exhaustively or by Optuna,
every point stored as Parquet under `out` (None: in memory).

`run_sweep` returns the search's objects (SweepRun); `sweep_report` returns the dict that
`trainmem sweep --json` prints (a SweepReport, which also carries the SweepRun's attributes).
Bad input raises ValueError (one line naming the field).
"""

from __future__ import annotations

import hashlib
import json
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
from trainmem.hardware._files import check_path_name
from trainmem.report import (
    ERROR_BAR_KEYS,
    check_headroom,
    check_options,
    choice,
    gib_to_bytes,
    jsonable,
    model_spec,
    overhead_overrides,
    training_config,
)

from ._axes import SHOW
from ._fleet_use import fleet_use
from ._options import SEARCH_DEFAULTS, SWEEP_OPTIONS, extra_fields
from ._parts import check_store
from ._risk import risk_text, space_risk
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
    tokens: float | None = None
    """The token budget (--tokens): the time to train it on the best point."""


def _constraints_text(
    min_gpus: int,
    use_all_gpus: bool,
    max_step_time_s: float | None,
    max_cost_per_million_tokens: float | None = None,
) -> str:
    """``-min32-all-max20s-max0.2usd``: the constraints a default study name carries when set,
    so that a sweep under other constraints is another study (an Optuna study rebuilt from its
    points would otherwise mix points judged under both)."""
    parts = [f"min{min_gpus}"] if min_gpus > 1 else []
    if use_all_gpus:
        parts.append("all")
    if max_step_time_s is not None:
        parts.append(f"max{max_step_time_s:g}s")
    if max_cost_per_million_tokens is not None:
        parts.append(f"max{max_cost_per_million_tokens:g}usd")
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
    max_cost_per_million_tokens: float | None = None,
    tokens: float | None = None,
    headroom: float = 0.10,
    hardware_dir: str | None = None,
    models_dir: str | None = None,
    optimizers_dir: str | None = None,
    profile_file: str | None = None,
    family: str | None = None,
    progress: Progress | None = None,
    allow_long_seq: bool = False,
    lengths: str | list[int] | None = None,
    lengths_histogram: str | list[Any] | None = None,
    batching: str = "pad-longest",
    buckets: str | None = None,
    risk: float = 0.001,
    overhead: list[str] | None = None,
    overhead_file: str | None = None,
    **fields: Any,
) -> SweepRun:
    """Search `fleet` for the best configurations of the job (SWEEP_OPTIONS).

    The job's training fields: `training` updated by keyword fields, over SEARCH_DEFAULTS; a
    searched field (SWEEP_AXES) given pins its axis, None leaves it searched. `overhead`,
    `overhead_file`: estimate's, over every pool's GPU defaults (`Space.overheads`).
    """
    job = _SweepJob(**locals())  # every parameter, first: the steps below take the job
    training, optimizer_fields, objectives, overheads = _checked(job)
    space = _job_space(job, training, optimizer_fields, overheads)
    study = _study_name(job, space.model.name, training, space)
    result = _search(space, job, study=study, objectives=objectives)
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
        tokens=tokens,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _SweepJob:
    """The arguments of one `run_sweep` call, so that its steps take one value instead of the
    29 options each (built from the call's locals: a parameter added there and not here is a
    TypeError on the first call)."""

    training: TrainingConfig | Mapping[str, Any] | None
    model: str
    fleet: str
    method: str
    trials: int
    seed: int
    objective: str
    storage: str | None
    study_name: str | None
    workers: int
    warm_start: bool
    jobs: int
    scheduler: str | None
    out: str | None
    store: str
    max_micro_batch_size: int
    max_pp: int
    max_cp: int
    host_memory_gib: float | None
    min_gpus: int
    use_all_gpus: bool
    max_step_time_s: float | None
    max_cost_per_million_tokens: float | None
    tokens: float | None
    headroom: float
    hardware_dir: str | None
    models_dir: str | None
    optimizers_dir: str | None
    profile_file: str | None
    family: str | None
    progress: Progress | None
    allow_long_seq: bool
    lengths: str | list[int] | None
    lengths_histogram: str | list[Any] | None
    batching: str
    buckets: str | None
    risk: float
    overhead: list[str] | None
    overhead_file: str | None
    fields: dict[str, Any]


def _checked(
    job: _SweepJob,
) -> tuple[dict[str, Any], dict[str, Any], tuple[str, ...], dict[str, float]]:
    """The job's training fields (over SWEEP_OPTIONS' defaults), its optimizer's grid columns,
    its objectives and its overheads (--overhead-file's, --overhead's), every option checked
    first: bad input fails before the model or fleet is read, and before a point is written."""
    defaults = {o.name: o.default for o in SWEEP_OPTIONS if o.name in FIELD_NAMES}
    training = training_config(job.training, job.fields, defaults={**DEFAULTS_BY_FIELD, **defaults})
    choice("method", job.method, ("exhaustive", "optuna"))
    check_store(job.store)
    # precision and framework are judged once, with the other training fields, by
    # check_options (their closed vocabularies first) and, unset (None), by the engine's grid.
    optimizer_fields = optimizer_columns(training["optimizer"], job.optimizers_dir)
    objectives = parse_objectives(job.objective)
    check_headroom(job.headroom)
    counts = {
        "seed": job.seed,
        "trials": job.trials,
        "workers": job.workers,
        "jobs": job.jobs,
        "max_pp": job.max_pp,
        "max_cp": job.max_cp,
        "max_micro_batch_size": job.max_micro_batch_size,
    }
    check_options(
        SWEEP_OPTIONS,
        {
            **training,
            **counts,
            "headroom": job.headroom,
            "host_memory_gib": job.host_memory_gib,
            "min_gpus": job.min_gpus,
            "max_step_time_s": job.max_step_time_s,
            "max_cost_per_million_tokens": job.max_cost_per_million_tokens,
            "tokens": job.tokens,
        },
    )
    _check_method(job)
    overheads = overhead_overrides(job.overhead_file, job.overhead)
    return training, optimizer_fields, objectives, overheads


def _check_method(job: _SweepJob) -> None:
    """ValueError for an option of the other search (checked with the other options, before
    anything is read or written)."""
    if job.method == "exhaustive":
        if job.storage or job.workers != 1:
            raise ValueError("--storage and --workers apply to --method optuna")
        return
    if job.jobs != 1:
        raise ValueError("--jobs applies to --method exhaustive (optuna: --workers)")
    if job.store != "all":  # a study's best and top points are read back from all its points
        raise ValueError("--store applies to --method exhaustive (optuna stores every point)")
    if job.out is None:  # its workers share the points through the study's folder
        raise ValueError("out: --method optuna stores its points under a folder; got None")


def _job_space(
    job: _SweepJob,
    training: dict[str, Any],
    optimizer_fields: dict[str, Any],
    overheads: dict[str, float],
) -> Space:
    """The space of the job on its fleet (make_space); a traced profile only at the precision
    it was traced with; `--lengths`: the dataset's risk a constraint (sweep/_risk.py)."""
    risk = space_risk(
        lengths=job.lengths,
        lengths_histogram=job.lengths_histogram,
        batching=job.batching,
        buckets=job.buckets,
        risk=job.risk,
        seq_len=training["seq_len"],
    )
    gpus = load_gpus(job.hardware_dir)
    spec = model_spec(
        job.model, models_dir=job.models_dir, profile_file=job.profile_file, family=job.family
    )
    precision = training["precision"]
    if spec.profile is not None and precision not in (
        SEARCH_DEFAULTS["precision"],
        spec.profile.precision,
    ):
        raise ValueError(
            f"precision: --profile {job.profile_file} was traced with {spec.profile.precision}; "
            f"got --precision {precision}"
        )
    return make_space(
        spec,
        parse_fleet(job.fleet, gpus),
        gpus,
        seq_len=training["seq_len"],
        global_batch_size=training["global_batch_size"],
        precision=precision,
        optimizer=optimizer_fields,
        framework=training["framework"],
        max_micro_batch_size=job.max_micro_batch_size,
        max_pp=job.max_pp,
        max_cp=job.max_cp,
        headroom=job.headroom,
        training=extra_fields(training),
        optimizer_name=training["optimizer"],
        host_memory_bytes=gib_to_bytes(job.host_memory_gib),
        min_gpus=job.min_gpus,
        use_all_gpus=job.use_all_gpus,
        max_step_time_s=job.max_step_time_s,
        max_cost_per_million_tokens=job.max_cost_per_million_tokens,
        allow_long_seq=job.allow_long_seq,
        risk=risk,
        overheads=overheads,
    )


def _study_name(job: _SweepJob, model_name: str, training: Mapping[str, Any], space: Space) -> str:
    """`--study-name`, else the default one: model, fleet, length, batch, method, the
    constraints set (`_constraints_text`), the dataset's risk (`risk_text`) and the overheads
    given (`overheads_text`)."""
    return job.study_name or _default_study(
        model_name,
        job.fleet,
        training["seq_len"],
        training["global_batch_size"],
        job.method
        + _constraints_text(
            job.min_gpus, job.use_all_gpus, job.max_step_time_s, job.max_cost_per_million_tokens
        )
        + risk_text(space.risk)
        + overheads_text(space.overheads),
    )


def overheads_text(overheads: Mapping[str, float]) -> str:
    """``-ov3f2a1c``: what a default study name carries when --overhead or --overhead-file
    set values (a digest of them), so that a sweep under other overheads is another study (an
    Optuna study rebuilt from its points would otherwise mix points judged under both); "" when
    none is set (the study keeps the name it always had)."""
    if not overheads:
        return ""
    text = json.dumps(sorted((k, float(v)) for k, v in overheads.items()))
    return f"-ov{hashlib.sha256(text.encode()).hexdigest()[:6]}"


def _search(
    space: Space, job: _SweepJob, *, study: str, objectives: tuple[str, ...]
) -> SearchResult:
    """The job's search of `space`: exhaustive or Optuna, each refusing the other's options."""
    if job.method == "exhaustive":
        return run_exhaustive(
            space,
            out=job.out,
            study=study,
            objectives=objectives,
            jobs=job.jobs,
            store=job.store,
            progress=job.progress,
            scheduler=job.scheduler,
        )
    assert job.out is not None, "refused by _check_method"
    return run_optuna(
        space,
        out=job.out,
        study=study,
        trials=job.trials,
        objectives=objectives,
        seed=job.seed,
        storage=job.storage,
        workers=job.workers,
        warm_start=job.warm_start,
        progress=job.progress,
        scheduler=job.scheduler,
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
        **_fleet_use(done),
    }
    if len(objectives) > 1:
        payload["pareto"] = [point_json(r) for r in result.best]
    if done.space.warnings:  # present only when there is something to say
        payload["warnings"] = list(done.space.warnings)
    return payload


def _fleet_use(done: SweepRun) -> dict[str, Any]:
    """`fleet_gpus`, `used_gpus`, `tokens`, `time_to_train_s`, `cost_to_train_usd` of the best
    point (used_gpus None for a Pareto front or when nothing fits)."""
    best = done.result.best[0] if len(done.result.best) == 1 else {}
    return fleet_use(
        done.space.fleet,
        used_gpus=best.get("num_gpus"),
        tokens=done.tokens,
        tokens_per_second=best.get("tokens_per_second"),
        cost_per_million_tokens=best.get("cost_per_million_tokens"),
    )


def point_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """One point of the sweep's JSON: its configuration (the SHOW columns), fit, cost, time,
    peak and breakdown; with `--lengths`, the epoch's risk (issue 28's keys:
    oom_probability, worst_step_peak_device_bytes, step_peak_quantiles p50/p99/max)."""
    risk: dict[str, Any] = {}
    if row.get("oom_probability") is not None:
        worst = row["worst_step_peak_device_bytes"]
        risk = {
            "oom_probability": row["oom_probability"],
            "worst_step_peak_device_bytes": worst,
            "step_peak_quantiles": {
                "p50": row["step_peak_p50_device_bytes"],
                "p99": row["step_peak_p99_device_bytes"],
                "max": worst,
            },
        }
    return jsonable(
        {
            "configuration": {k: row[k] for k in SHOW},
            "fits": row["fits"],
            "cost_per_million_tokens": row["cost_per_million_tokens"],
            "step_time_s": row["step_time_s"],
            "tokens_per_second": row["tokens_per_second"],
            "mfu": row["mfu"],
            "peak_device_bytes": row["peak_device_bytes"],
            # the error bars (report/_error_bars.py); None on a part older than schema 7
            **{k: row.get(k) for k in ERROR_BAR_KEYS},
            "breakdown": {k: row[k] for k in COMPONENTS},
            **risk,
        }
    )


def check_out_dir(out: str) -> None:
    """ValueError ("out: ...") when the output folder names a file or cannot be created or
    written (checked before any point is computed). A URL (s3://...) is checked by its store
    when the first part is written; file:// is a path."""
    from trainmem.results._store import is_url, local_path

    if is_url(out):
        return
    check_path_name(out, what="out")
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
