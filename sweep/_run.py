"""`trainmem sweep` as a function: a job's space on a fleet, searched exhaustively or by Optuna,
every point stored as Parquet under `out` (None: in memory).

Bad input raises ValueError (one line naming the field).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainmem.catalog import optimizer_columns
from trainmem.engine import (
    DEFAULTS_BY_FIELD,
    FIELD_NAMES,
    FRAMEWORKS,
    PRECISIONS,
    SWEEP_AXES,
    TrainingConfig,
)
from trainmem.hardware import load_gpus, parse_fleet
from trainmem.report import (
    AS_JSON,
    HEADROOM,
    MODEL,
    PROFILE_FILE,
    USER_DIRS,
    Option,
    check_headroom,
    check_options,
    choice,
    model_spec,
    training_config,
    training_options,
)

from ._options import FLEET, SEARCH_DEFAULTS, SEARCH_OPTIONS, extra_fields
from ._search import Progress, SearchResult, parse_objectives, run_exhaustive, run_optuna
from ._space import Space, make_space

SWEEP_OPTIONS: tuple[Option, ...] = (
    MODEL,
    FLEET,
    *training_options(
        defaults=SEARCH_DEFAULTS, exclude=("sequence_parallel",), optional=SWEEP_AXES
    ),
    Option(name="method", type=str, default="exhaustive", help="exhaustive|optuna"),
    Option(name="trials", type=int, default=200, ge=1, help="Optuna: the study's total trials."),
    Option(name="seed", type=int, default=0, help="Optuna sampler seed."),
    Option(
        name="objective",
        type=str,
        default="cost",
        help="cost | time | gpus; two comma-separated: the Pareto front.",
    ),
    Option(
        name="storage",
        type=str | None,
        default=None,
        help="Optuna RDB URL (default: sqlite file in --out).",
    ),
    Option(name="study_name", type=str | None, default=None, help="Study name (default: derived)."),
    Option(name="workers", type=int, default=1, ge=1, help="Optuna: local worker processes."),
    Option(
        name="jobs", type=int, default=1, ge=1, help="Exhaustive: local processes over the chunks."
    ),
    Option(name="out", type=str, default="out", help="Output folder (Parquet points, Optuna db)."),
    *SEARCH_OPTIONS[1:],
    HEADROOM,
    *USER_DIRS,
    PROFILE_FILE,
    AS_JSON,
)
"""`trainmem sweep`: the search defaults (SEARCH_DEFAULTS); a searched field given pins its
axis, any other training field given is fixed for every point."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepRun:
    """A finished sweep: its search result, the space searched, the study name, objectives."""

    result: SearchResult
    space: Space
    study: str
    objectives: tuple[str, ...]


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
    jobs: int = 1,
    out: str | None = "out",
    max_micro_batch_size: int = 16,
    max_pp: int = 16,
    max_cp: int = 4,
    headroom: float = 0.10,
    hardware_dir: str | None = None,
    models_dir: str | None = None,
    optimizers_dir: str | None = None,
    profile_file: str | None = None,
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
    choice("precision", precision, PRECISIONS)
    optimizer_fields = optimizer_columns(optimizer, optimizers_dir)
    choice("framework", framework, FRAMEWORKS)
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
    check_options(SWEEP_OPTIONS, {**training, **counts, "headroom": headroom})
    gpus = load_gpus(hardware_dir)
    spec = model_spec(model, models_dir=models_dir, profile_file=profile_file)
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
    )
    study = study_name or _default_study(spec.name, fleet, seq_len, global_batch_size, method)
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
        jobs=jobs,
        progress=progress,
    )
    return SweepRun(result=result, space=space, study=study, objectives=objectives)


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
    progress: Progress | None = None,
) -> SearchResult:
    if method == "exhaustive":
        if storage or workers != 1:
            raise ValueError("--storage and --workers apply to --method optuna")
        return run_exhaustive(
            space, out=out, study=study, objectives=objectives, jobs=jobs, progress=progress
        )
    if jobs != 1:
        raise ValueError("--jobs applies to --method exhaustive (optuna: --workers)")
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
        progress=progress,
    )
