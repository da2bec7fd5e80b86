"""`trainmem fit`: the largest micro-batch (or fewest GPUs) of a job that fits, as a dict.

Bad input raises ValueError (one line naming the field).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from trainmem.catalog import optimizer_columns
from trainmem.engine import (
    DEFAULTS,
    KNOBS,
    ModelSpec,
    Overheads,
    TimeParams,
    TrainingConfig,
    estimate,
    estimate_time,
    layout_reason,
    make_grid,
    reason_text,
    time_inputs,
)
from trainmem.engine._rl import trainer_grid
from trainmem.hardware import GpuProfile, get_gpu
from trainmem.report import (
    ALLOW_LONG_SEQ,
    AS_JSON,
    CHECK,
    ERROR_BAR_KEYS,
    FAMILY,
    GPU,
    HEADROOM,
    HOST_MEMORY_GIB,
    JOB_DEFAULT_MODEL,
    JOB_DEFAULTS,
    JOB_MODEL,
    MINIMIZE,
    OVERHEAD_OPTIONS,
    PROFILE_FILE,
    USER_DIRS,
    Option,
    advice_report,
    check_headroom,
    check_layout,
    check_options,
    choice,
    gpu_overheads,
    host_reason,
    job_warnings,
    jsonable,
    model_spec,
    node_host,
    overhead_overrides,
    row_report,
    time_report,
    traced_choices,
    training_config,
    training_options,
)
from trainmem.report._estimate import NodeHost
from trainmem.report._options import RISK_OPTIONS
from trainmem.report._risk import check_risk_options, risk_answers, risk_keys
from trainmem.report._rl import fold_rl, is_rl, rl_columns, rl_report

MINIMIZE_OPTIONS = (
    Option(
        name="minimize",
        type=str,
        default="micro-batch-size",
        choices=MINIMIZE,
        help="micro-batch-size: the largest that fits; num-gpus: the fewest GPUs.",
    ),
    Option(
        name="max_micro_batch_size",
        type=int,
        default=1024,
        ge=1,
        le=1 << 16,
        help="Largest micro-batch tried.",
    ),
    Option(
        name="max_num_gpus",
        type=int,
        default=16384,
        ge=1,
        le=1 << 20,
        help="Most GPUs tried (num-gpus).",
    ),
)
FIT_OPTIONS: tuple[Option, ...] = (
    JOB_MODEL,
    FAMILY,
    GPU,
    *training_options(defaults=JOB_DEFAULTS),
    HEADROOM,
    HOST_MEMORY_GIB,
    ALLOW_LONG_SEQ,
    *USER_DIRS,
    *OVERHEAD_OPTIONS,
    *MINIMIZE_OPTIONS,
    PROFILE_FILE,
    AS_JSON,
    CHECK,
    *RISK_OPTIONS,
)
"""`trainmem fit`, `POST /v1/fit`, `trainmem.fit`."""


def fit_report(
    training: TrainingConfig | Mapping[str, Any] | None = None,
    *,
    model: str = JOB_DEFAULT_MODEL,
    gpu: str = "h100-sxm-80gb",
    headroom: float = 0.10,
    host_memory_gib: float | None = None,
    hardware_dir: str | None = None,
    minimize: str = "micro-batch-size",
    max_micro_batch_size: int = 1024,
    max_num_gpus: int = 16384,
    models_dir: str | None = None,
    optimizers_dir: str | None = None,
    profile_file: str | None = None,
    family: str | None = None,
    allow_long_seq: bool = False,
    lengths: str | list[int] | None = None,
    lengths_histogram: str | list[Any] | None = None,
    batching: str = "pad-longest",
    buckets: str | None = None,
    risk: float = 0.001,
    overhead: list[str] | None = None,
    overhead_file: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """`trainmem fit --json`: the largest micro-batch (or fewest GPUs) that fits, its estimate,
    and the advice when nothing fits.

    The job is `training` updated by keyword training fields (as `estimate_report`); the
    searched field (micro_batch_size or num_gpus) is replaced by the candidates. `overhead`,
    `overhead_file`: estimate's (the file's values, the items' winning), on every candidate.
    """
    job = _FitJob(**locals())  # every parameter, first: the steps below take the job
    inputs = _fit_inputs(job)
    scan = _scan(job, inputs)
    report = _chosen_report(job, inputs, scan)
    result = _fit_result(job.key, scan, report)
    if scan.risk is not None:  # issue 28's keys at the top level, and the `risk` block
        result.update(risk_keys(scan.risk))
    out, row = scan.out, scan.row
    if (
        not len(scan.fitting)
        and out["reason"][row] == 0
        and not out["fits"][row]
        and scan.risk is None
    ):
        result.update(_closest(job, inputs, scan, report))
    if inputs.warnings:  # present only when there is something to say
        result["warnings"] = inputs.warnings
    return jsonable(result)


@dataclass(frozen=True, slots=True, kw_only=True)
class _FitJob:
    """The arguments of one `fit_report` call, so that its steps take one value (built from
    the call's locals: a parameter added there and not here is a TypeError on the first call)."""

    training: TrainingConfig | Mapping[str, Any] | None
    model: str
    gpu: str
    headroom: float
    host_memory_gib: float | None
    hardware_dir: str | None
    minimize: str
    max_micro_batch_size: int
    max_num_gpus: int
    models_dir: str | None
    optimizers_dir: str | None
    profile_file: str | None
    family: str | None
    allow_long_seq: bool
    lengths: str | list[int] | None
    lengths_histogram: str | list[Any] | None
    batching: str
    buckets: str | None
    risk: float
    overhead: list[str] | None
    overhead_file: str | None
    fields: dict[str, Any]

    @property
    def key(self) -> str:
        """The grid field searched: micro_batch_size or num_gpus."""
        return "micro_batch_size" if self.minimize == "micro-batch-size" else "num_gpus"


class _FitInputs(NamedTuple):
    """The checked job: its model, GPU, training configuration (a traced profile's choices
    applied) and the grid's columns of it (a user optimizer as its columns)."""

    spec: ModelSpec
    profile: GpuProfile
    training: TrainingConfig
    config: dict[str, Any]
    optimizer: str
    warnings: list[str]
    """A sequence beyond the model's rotary positions (job_warnings)."""
    overrides: dict[str, float]
    """--overhead-file's and --overhead's values (the GPU's own defaults for the rest)."""


def _fit_inputs(job: _FitJob) -> _FitInputs:
    """Every option checked, then the model and GPU read: bad input fails before any estimate."""
    values = training_config(job.training, job.fields)
    optimizer = values["optimizer"]
    optimizer_fields = optimizer_columns(optimizer, job.optimizers_dir)
    config_ = TrainingConfig.from_fields(values)
    choice("minimize", job.minimize, MINIMIZE)
    check_headroom(job.headroom)
    check_options(
        (*MINIMIZE_OPTIONS, HOST_MEMORY_GIB),
        {
            "max_micro_batch_size": job.max_micro_batch_size,
            "max_num_gpus": job.max_num_gpus,
            "host_memory_gib": job.host_memory_gib,
        },
    )
    spec = model_spec(
        job.model, models_dir=job.models_dir, profile_file=job.profile_file, family=job.family
    )
    precision, recompute, attention = traced_choices(
        spec, config_.precision, config_.recompute, config_.attention
    )
    config_ = config_.replace(precision=precision, recompute=recompute, attention=attention)
    profile = get_gpu(job.gpu, job.hardware_dir)
    overrides = overhead_overrides(job.overhead_file, job.overhead, profiles=(profile,))
    config_, warnings = job_warnings(spec, profile, config_, allow_long_seq=job.allow_long_seq)
    config: dict[str, Any] = config_.grid_columns()
    config.update(optimizer_fields)
    return _FitInputs(spec, profile, config_, config, optimizer, warnings, overrides)


class _Scan(NamedTuple):
    """The candidates' estimate and the row the answer reads."""

    candidates: np.ndarray
    out: dict[str, np.ndarray]
    overheads: Overheads
    host: NodeHost
    fitting: np.ndarray
    """Rows that fit their GPUs and their node's host RAM."""
    row: int
    chosen: dict[str, Any]
    """The job's grid columns with the row's candidate."""
    risk: dict[str, Any] | None
    """The row's `risk` block (`--lengths`), else None."""
    rl: dict[str, np.ndarray] | None = None
    """An RL job's phases (report/_rl.py rl_columns) of every candidate, else None."""


def _candidates(job: _FitJob, training: TrainingConfig) -> np.ndarray:
    """Micro-batches 1..max, or GPU counts in steps of one model replica (tp x pp x cp)."""
    if job.key == "micro_batch_size":
        return np.arange(1, job.max_micro_batch_size + 1)
    step = max(training.tp * training.pp * training.cp, 1)
    return np.arange(step, max(job.max_num_gpus, step) + 1, step)


def _scan(job: _FitJob, inputs: _FitInputs) -> _Scan:
    """Every candidate in one vectorized estimate; the row: the largest micro-batch (fewest
    GPUs) that fits, else (nothing fits) the valid candidate with the most headroom."""
    profile, key = inputs.profile, job.key
    candidates = _candidates(job, inputs.training)
    grid = make_grid({**inputs.config, key: candidates})
    ov = gpu_overheads(profile, inputs.overrides)
    out = estimate(
        inputs.spec,
        trainer_grid(grid),  # DPO: chosen and rejected, twice the sequences
        usable_bytes=profile.usable_bytes,
        headroom=job.headroom,
        overheads=ov,
    )
    rl = None
    if is_rl(grid):  # the rollout and score phases judge the fit too
        rl = rl_columns(
            inputs.spec,
            grid,
            out,
            usable_bytes=profile.usable_bytes,
            headroom=job.headroom,
            overheads=ov,
        )
        out = fold_rl(out, rl, grid, limit_bytes=profile.usable_bytes * (1.0 - job.headroom))
    host = node_host(
        np.maximum(out["host_bytes"], out["load_host_bytes"]),
        grid["num_gpus"],
        profile,
        job.host_memory_gib,
    )
    fits = out["fits"]
    risks = _risks(job, inputs, candidates, ov)
    if risks is not None:  # a dataset: a candidate fits when its epoch is within --risk
        within = np.array([r["within_risk"] for r in risks])
        fits = within & (out["reason"] == 0)
    fitting = np.flatnonzero(fits & host.fits)
    if len(fitting):
        row = int(fitting[-1] if key == "micro_batch_size" else fitting[0])
    else:  # nothing fits: report the closest candidate (most headroom) and why
        valid = np.flatnonzero(out["reason"] == 0)
        if not len(valid):
            _refuse_invalid_layout(job, inputs, candidates)
        row = int(valid[np.argmax(out["headroom_bytes"][valid])]) if len(valid) else 0
    chosen = {**inputs.config, key: int(candidates[row])}
    return _Scan(
        candidates, out, ov, host, fitting, row, chosen, None if risks is None else risks[row], rl
    )


def _risks(
    job: _FitJob, inputs: _FitInputs, candidates: np.ndarray, ov: Overheads
) -> list[dict[str, Any]] | None:
    """`--lengths`: each micro-batch candidate's `risk` block (None without a dataset)."""
    data = check_risk_options(
        job.lengths, job.lengths_histogram, batching=job.batching, risk=job.risk
    )
    if data is None:
        return None
    if job.key != "micro_batch_size":
        raise ValueError(
            "lengths: fit over a dataset searches the micro-batch (--minimize micro-batch-size)"
        )
    return risk_answers(
        inputs.spec,
        inputs.config,
        data,
        batching=job.batching,
        buckets=job.buckets,
        risk=job.risk,
        micro_batches=candidates,
        usable_bytes=inputs.profile.usable_bytes,
        headroom=job.headroom,
        overheads=ov,
    )


def _refuse_invalid_layout(job: _FitJob, inputs: _FitInputs, candidates: np.ndarray) -> None:
    """ValueError `layout: ...` (as `estimate` says it, exit 2) when no candidate is a valid
    layout because the job's own layout is invalid: no value of the searched field could make
    it valid. Micro-batch 1 is the most permissive micro-batch (a larger one only divides the
    global batch less), so its rule decides; GPU counts are tried up to num_gpus' bound (not
    --max-num-gpus): when one of those is valid, the search space was too small (exit 1 with
    --check, the reason in the answer)."""
    if job.key == "num_gpus":
        step = int(candidates[0])
        wider = np.arange(step, int(KNOBS["num_gpus"].le or step) + 1, step)
        grid = make_grid({**inputs.config, "num_gpus": wider})
        if (layout_reason(inputs.spec, grid) == 0).any():
            return
    check_layout(inputs.spec, make_grid({**inputs.config, job.key: int(candidates[0])}))


def _row_of(out: Mapping[str, Any], row: int) -> dict[str, np.ndarray]:
    """One row of estimate()'s columns, as one-row columns (what the reports read)."""
    return {k: np.asarray(v)[row : row + 1] for k, v in out.items()}


def _chosen_report(job: _FitJob, inputs: _FitInputs, scan: _Scan) -> dict[str, Any]:
    """The chosen candidate's estimate report, with its step time and cost."""
    profile = inputs.profile
    report = row_report(
        inputs.spec,
        _row_of(scan.out, scan.row),
        gpu=profile,
        config=scan.chosen,
        headroom=job.headroom,
    )
    if scan.rl is not None:
        report = rl_report(report, scan.rl, config=scan.chosen, row=scan.row)
    timing = estimate_time(inputs.spec, make_grid(scan.chosen), **time_inputs(profile))
    report["time"] = time_report(timing, price_per_gpu_hour_usd=profile.price_per_hour_usd)
    return report


def _fit_result(key: str, scan: _Scan, report: dict[str, Any]) -> dict[str, Any]:
    """The answer's keys: the largest micro-batch (fewest GPUs) or None, whether it fits and
    why not, the chosen candidate's estimate and its node's host RAM."""
    out, row, host = scan.out, scan.row, scan.host
    answer_key = "max_micro_batch_size" if key == "micro_batch_size" else "min_num_gpus"
    answer = int(scan.candidates[row]) if len(scan.fitting) else None
    reason = reason_text(out["reason"][row])
    # The host's memory is the reason only where the GPU holds the job (step and load).
    if not reason and not len(scan.fitting) and out["fits"][row] and not host.fits[row]:
        reason = host_reason(float(host.need_bytes[row]), host.limit_bytes, int(host.ranks[row]))
    return {
        answer_key: answer,
        "fits": bool(len(scan.fitting)),
        "reason": reason or ("" if len(scan.fitting) else "does not fit"),
        "estimate": report,
        # the chosen candidate's error bars (report/_error_bars.py), at the answer's top
        **{k: report[k] for k in ERROR_BAR_KEYS},
        "host_memory_per_node_bytes": host.limit_bytes,
        "node_host_bytes": int(round(float(host.need_bytes[row]))),
        "host_fits": bool(host.fits[row]),
    }


def _closest(
    job: _FitJob, inputs: _FitInputs, scan: _Scan, report: dict[str, Any]
) -> dict[str, Any]:
    """Nothing fits: the closest candidate's peak, how far it is over the limit (usable x
    (1 - headroom)), and the same advice `estimate` gives, from that candidate."""
    return {
        "closest_peak_device_bytes": int(report["peak_device_bytes"]),
        "shortfall_bytes": int(-report["headroom_bytes"]),
        **advice_report(
            inputs.spec,
            {**DEFAULTS, **scan.chosen},
            profile=inputs.profile,
            out=_row_of(scan.out, scan.row),
            headroom=job.headroom,
            overheads=scan.overheads,
            overhead_overrides=inputs.overrides,
            time_params=TimeParams(),
            hardware_dir=job.hardware_dir,
            optimizer_name=inputs.optimizer,
        ),
    }
