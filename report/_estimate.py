"""The commands' work as functions of their fields: one JSON-able dict out, nothing printed.

The CLI commands (sweep/cli.py, sweep/_commands.py) print what these return; the HTTP service
(sweep/_serve.py) answers with it. A command's typer signature is the one declaration of its
fields (names, types, defaults, help): `command_fields` reads them back from the command's
locals, `command_defaults` from its signature.

Bad input raises ValueError (one line naming the field).
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from trainmem.catalog import load_model, load_profile, optimizer_columns
from trainmem.engine import (
    DEFAULTS,
    DEFAULTS_BY_FIELD,
    FIELD_NAMES,
    FRAMEWORKS,
    OUTPUT_DTYPES,
    PROFILE_MISMATCH,
    ModelSpec,
    Overheads,
    TimeParams,
    TrainingConfig,
    encode_row,
    estimate,
    estimate_one,
    estimate_time_one,
    layout_reason,
    layout_reason_one,
    make_grid,
    node_host_bytes,
    overheads_for,
    ranks_per_node,
    reason_text,
    resolved_loss,
    time_inputs,
)
from trainmem.engine._rl import RL_NONE, trainer_grid
from trainmem.hardware import GIB, GpuProfile, get_gpu

from ._advice import advice_report
from ._options import DEFAULT_PRECISIONS, JOB_DEFAULT_MODEL, JOB_DEFAULTS, gib_to_bytes
from ._overhead_file import overhead_items
from ._risk import check_risk_options, risk_answers, risk_keys
from ._rl import rl_columns, rl_report, rl_top_consumers
from ._row import row_report, stage_summary, time_report
from ._validate import (
    check_choices,
    check_headroom,
    check_lora_rank,
    check_overhead_bytes,
    key_numbers,
    runnable_precision,
    seq_len_warnings,
)

OUTPUT_FIELDS = ("as_json", "check")
"""Command options that choose how a report is printed, not what it says."""

MINIMIZE = ("micro-batch-size", "num-gpus")
DEFAULT_MODEL = "llama-3.1-8b"
"""The commands' --model default: with --profile, --model is left at it or names the profile."""


def model_spec(
    model: str, *, models_dir: str | None, profile_file: str | None, family: str | None = None
) -> ModelSpec:
    """The model a command estimates: a preset or config.json (`family`: read with that
    family's layout, `--family`), or a traced profile file.

    With `profile_file` (--profile), `model` must be left at its default (a search's or one
    job's) or equal the profile's name.
    """
    if profile_file is None:
        return load_model(model, models_dir=models_dir, family=family)
    if family is not None:
        raise ValueError(
            f"family: --family applies to a config.json, not to --profile {profile_file}"
        )
    spec = load_profile(profile_file)
    if model not in (DEFAULT_MODEL, JOB_DEFAULT_MODEL, spec.name):
        raise ValueError(
            f"model: --model {model} conflicts with --profile {profile_file} (model "
            f"{spec.name!r}); leave --model out"
        )
    return spec


def traced_choices(spec: ModelSpec, precision: str, recompute: str, attention: str):
    """(precision, recompute, attention): with a traced profile, those left at their defaults
    (TrainingConfig's or one job's, JOB_DEFAULTS) become the traced ones (an explicit other
    value then fails the layout check)."""
    p = spec.profile
    if p is None:
        return precision, recompute, attention
    return tuple(
        traced if given in (DEFAULTS[key], JOB_DEFAULTS.get(key, DEFAULTS[key])) else given
        for key, given, traced in (
            ("precision", precision, p.precision),
            ("recompute", recompute, p.recompute),
            ("attention", attention, p.attention),
        )
    )


def check_layout(spec: ModelSpec, grid: dict[str, np.ndarray]) -> None:
    """One-line ValueError when the single row of `grid` is not a valid layout for `spec`."""
    check_layout_code(spec, int(layout_reason(spec, grid)[0]))


def check_layout_code(spec: ModelSpec, code: int) -> None:
    """check_layout of a row whose layout_reason is `code`."""
    if code == PROFILE_MISMATCH and spec.profile is not None:
        raise ValueError(
            f"layout: profile {spec.name!r} holds only for {spec.profile.valid_for_text}"
        )
    if code:
        raise ValueError(f"layout: {reason_text(code)}")


def command_fields(scope: Mapping[str, Any]) -> dict[str, Any]:
    """A command's option values (its locals at entry) without the output-only ones."""
    return {k: v for k, v in scope.items() if k not in OUTPUT_FIELDS}


def command_defaults(command: Callable[..., Any]) -> dict[str, Any]:
    """Every option of a typer command with its default (the one declaration of the fields)."""
    return {
        name: p.default
        for name, p in inspect.signature(command).parameters.items()
        if name not in OUTPUT_FIELDS
    }


def jsonable(value: Any) -> Any:
    """numpy scalars to Python, non-finite floats to None, recursively."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def json_text(value: Any, *, indent: int | None = 2) -> str:
    """`value` as JSON text, never a bare NaN or Infinity (invalid JSON): `jsonable` maps
    non-finite floats to null, and json refuses any left (allow_nan=False)."""
    return json.dumps(jsonable(value), indent=indent, allow_nan=False)


# ---- estimate ----------------------------------------------------------------------------------


def training_config(
    training: TrainingConfig | Mapping[str, Any] | None,
    fields: Mapping[str, Any],
    *,
    defaults: Mapping[str, Any] = DEFAULTS_BY_FIELD,
) -> dict[str, Any]:
    """The training fields of a call: `defaults`, then `training`, then keyword fields; `loss
    auto` resolved to the framework's own loss (what the engine runs, and what the reports and
    their JSON show).

    An unknown name is a TypeError (as for any unexpected keyword argument).
    """
    base = training.as_dict() if isinstance(training, TrainingConfig) else dict(training or {})
    values = {**defaults, **base, **fields}
    unknown = sorted(set(values) - set(FIELD_NAMES))
    if unknown:
        raise TypeError(
            f"unexpected keyword argument {unknown[0]!r}; training fields: {', '.join(FIELD_NAMES)}"
        )
    # An unknown framework stays as given: the field's check names it with the allowed values.
    if values.get("loss") == "auto" and values.get("framework") in FRAMEWORKS:
        values["loss"] = resolved_loss(values["framework"], "auto")
    return values


def estimate_report(
    training: TrainingConfig | Mapping[str, Any] | None = None,
    *,
    model: str = JOB_DEFAULT_MODEL,
    gpu: str = "h100-sxm-80gb",
    headroom: float = 0.10,
    hardware_dir: str | None = None,
    models_dir: str | None = None,
    optimizers_dir: str | None = None,
    overhead: list[str] | None = None,
    overhead_file: str | None = None,
    per_stage: bool = False,
    advice: bool = True,
    tokens: float | None = None,
    time_param: list[str] | None = None,
    profile_file: str | None = None,
    host_memory_gib: float | None = None,
    family: str | None = None,
    allow_long_seq: bool = False,
    lengths: str | list[int] | None = None,
    lengths_histogram: str | list[Any] | None = None,
    batching: str = "pad-longest",
    buckets: str | None = None,
    risk: float = 0.001,
    **fields: Any,
) -> dict[str, Any]:
    """`trainmem estimate --json`: the per-device breakdown, phase peaks, fit, time and advice.

    The job is `training` (a TrainingConfig or a mapping of its fields) updated by keyword
    training fields; every option is ESTIMATE_OPTIONS' (report/_options.py). Training fields
    not given are TrainingConfig's defaults (1 GPU, no ZeRO); the command line and HTTP start
    from one job's defaults instead (JOB_DEFAULTS: 8 GPUs, ZeRO-3, full recompute, ...).
    """
    overhead = overhead_items(overhead_file, overhead)  # the file's, then the flags' (win)
    job = _EstimateJob(**locals())  # every parameter, first: the steps below take the job
    inputs = _estimate_inputs(job)
    check_layout_code(inputs.spec, layout_reason_one(inputs.spec, inputs.row))
    profile = inputs.profile
    ov = overheads_for(profile.arch, cuda_context_bytes=profile.cuda_context_bytes)
    overrides = key_numbers("--overhead", overhead or [], Overheads.names())
    ov = ov.with_overrides(overrides)
    check_overhead_bytes(overrides, profile)
    report, out, step_config = _memory_report(job, inputs, ov)
    if inputs.warnings:  # present only when there is something to say
        report["warnings"] = inputs.warnings
    report["time"], time_params = _time_report(job, inputs)
    report["pp_stage"] = int(out["pp_stage"][0])
    report.update(_advice(job, inputs, out, ov, time_params, step_config))
    rollout_consumers = rl_top_consumers(report)
    if rollout_consumers is not None:
        report["top_consumers"] = rollout_consumers
    if per_stage:
        report["stages"] = _stage_reports(job, inputs, ov)
    report.update(_risk_block(job, inputs, ov))
    return report


@dataclass(frozen=True, slots=True, kw_only=True)
class _EstimateJob:
    """The arguments of one `estimate_report` call, so that its steps take one value (built
    from the call's locals: a parameter added there and not here is a TypeError on the first
    call)."""

    training: TrainingConfig | Mapping[str, Any] | None
    model: str
    gpu: str
    headroom: float
    hardware_dir: str | None
    models_dir: str | None
    optimizers_dir: str | None
    overhead: list[str] | None
    overhead_file: str | None
    per_stage: bool
    advice: bool
    tokens: float | None
    time_param: list[str] | None
    profile_file: str | None
    host_memory_gib: float | None
    family: str | None
    allow_long_seq: bool
    lengths: str | list[int] | None
    lengths_histogram: str | list[Any] | None
    batching: str
    buckets: str | None
    risk: float
    fields: dict[str, Any]


class _EstimateInputs(NamedTuple):
    """The checked job: its model, GPU, the training configuration's grid columns (`config`,
    reads), its one-row grid's values (`row`, encode_row: Python scalars, categorical codes),
    the optimizer's name, the pipeline degree and the warnings
    about it (a sequence beyond the model's positions)."""

    spec: ModelSpec
    profile: GpuProfile
    config: dict[str, Any]
    grid_config: dict[str, Any]
    row: dict[str, Any]
    optimizer: str
    pp: int
    warnings: list[str]


def _estimate_inputs(job: _EstimateJob) -> _EstimateInputs:
    """The training fields checked, the model and GPU read, a traced profile's choices applied
    (`traced_choices`), and the one-row grid built: bad input fails before any estimate."""
    values = training_config(job.training, job.fields)
    check_choices({"precision": values["precision"]})
    optimizer = values["optimizer"]
    optimizer_fields = optimizer_columns(optimizer, job.optimizers_dir)
    config_ = TrainingConfig.from_fields(values)
    check_headroom(job.headroom)
    spec = model_spec(
        job.model, models_dir=job.models_dir, profile_file=job.profile_file, family=job.family
    )
    precision, recompute, attention = traced_choices(
        spec, config_.precision, config_.recompute, config_.attention
    )
    chosen = (config_.precision, config_.recompute, config_.attention)
    if (precision, recompute, attention) != chosen:  # a traced profile's: checked again
        config_ = config_.replace(precision=precision, recompute=recompute, attention=attention)
    profile = get_gpu(job.gpu, job.hardware_dir)
    config_, warnings = job_warnings(spec, profile, config_, allow_long_seq=job.allow_long_seq)
    config: dict[str, Any] = config_.grid_columns()
    grid_config = {**config, **optimizer_fields}  # a user optimizer as engine columns
    row = encode_row(grid_config)  # make_grid's checks and values, as Python scalars
    return _EstimateInputs(spec, profile, config, grid_config, row, optimizer, config_.pp, warnings)


def job_warnings(
    spec: ModelSpec, profile: GpuProfile, training: TrainingConfig, *, allow_long_seq: bool
) -> tuple[TrainingConfig, list[str]]:
    """The physical checks of one job on one GPU (ValueError, one line): a precision the GPU
    runs (the default bf16 one on a GPU without bf16: its fp16 counterpart, with a warning,
    runnable_precision), a LoRA rank within the adapted matrices; the job as it runs and the
    warnings about it (also a sequence beyond the model's positions; learned positions are
    refused without `allow_long_seq`)."""
    precision, warnings = runnable_precision(
        training.precision, [profile], default=DEFAULT_PRECISIONS
    )
    check_lora_rank(spec, training.lora_rank, training.lora_targets)
    warnings += seq_len_warnings(spec, training.seq_len, allow_long_seq=allow_long_seq)
    if precision != training.precision:
        training = training.replace(precision=precision)
    return training, warnings


def _step_config(inputs: _EstimateInputs, grid: dict[str, np.ndarray]) -> dict[str, Any]:
    """The configuration the trainer's step runs: the job's, and for an RL job (its one-row
    `grid`) the trainer's micro-batches (trainer_grid: DPO's pairs, twice the sequences; a
    packed or unpadded row of tokens)."""
    if inputs.row["rl"] == RL_NONE:
        return inputs.grid_config
    doubled = trainer_grid(grid)
    return {
        **inputs.grid_config,
        **{k: int(doubled[k][0]) for k in ("micro_batch_size", "global_batch_size", "seq_len")},
    }


def _memory_report(
    job: _EstimateJob, inputs: _EstimateInputs, ov: Overheads
) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Any]]:
    """The per-device breakdown and peaks (the single-configuration path, `estimate_one`), with
    the node's host RAM: the report (its `fits` the GPU's and the host's), estimate()'s
    one-row columns and the configuration they were estimated on (_step_config)."""
    spec, profile = inputs.spec, inputs.profile
    rl = inputs.row["rl"] != RL_NONE
    # An RL job's phases run on the one-row grid (only then built: the report's fast path is
    # the encoded row).
    grid = make_grid(inputs.grid_config) if rl else {}
    step_config = _step_config(inputs, grid)
    out = _one_row(
        estimate_one(
            spec,
            step_config,
            usable_bytes=profile.usable_bytes,
            headroom=job.headroom,
            overheads=ov,
        )
    )
    report = row_report(spec, out, gpu=profile, config=inputs.config, headroom=job.headroom)
    if rl:
        phases = rl_columns(
            spec, grid, out, usable_bytes=profile.usable_bytes, headroom=job.headroom, overheads=ov
        )
        report = rl_report(report, phases, config=inputs.config)
    host_need = max(out["host_bytes"][0], out["load_host_bytes"][0])
    report.update(host_fit(host_need, inputs.config["num_gpus"], profile, job.host_memory_gib))
    report["fits"] = report["fits"] and report["host_fits"]
    return report, out, step_config


def _time_report(job: _EstimateJob, inputs: _EstimateInputs) -> tuple[dict[str, Any], TimeParams]:
    """The step time and cost (`--tokens`: of that many tokens), and the time parameters with
    the `--time-param` overrides (the advice's time uses them too)."""
    tokens = job.tokens
    if tokens is not None and not (tokens > 0 and np.isfinite(tokens)):
        raise ValueError(f"tokens: must be a number > 0, got {tokens}")
    time_params = TimeParams().with_overrides(
        key_numbers("--time-param", job.time_param or [], TimeParams.names())
    )
    profile = inputs.profile
    # check_layout passed: the one row is valid. estimate_time_one: estimate_time's values of
    # the row, to the bit, without numpy's per-call cost on one-element columns.
    timing = estimate_time_one(
        inputs.spec, inputs.row, time_inputs(profile), tokens=tokens, params=time_params
    )
    return time_report(timing, price_per_gpu_hour_usd=profile.price_per_hour_usd), time_params


def _advice(
    job: _EstimateJob,
    inputs: _EstimateInputs,
    out: dict[str, np.ndarray],
    ov: Overheads,
    time_params: TimeParams,
    step_config: dict[str, Any],
) -> dict[str, Any]:
    """The advice keys (`advice_report`): what to change when the job does not fit (only the
    top consumers under --no-advice); `step_config`: what `out` was estimated on (an RL
    trainer's own micro-batches: its consumers)."""
    return advice_report(
        inputs.spec,
        inputs.grid_config,
        step_config=step_config,
        profile=inputs.profile,
        out=out,
        headroom=job.headroom,
        overheads=ov,
        overhead_overrides=key_numbers("--overhead", job.overhead or [], Overheads.names()),
        time_params=time_params,
        hardware_dir=job.hardware_dir,
        optimizer_name=inputs.optimizer,
        changes=job.advice,
    )


def _stage_reports(
    job: _EstimateJob, inputs: _EstimateInputs, ov: Overheads
) -> list[dict[str, Any]]:
    """`--per-stage`: each pipeline stage's summary, from one estimate of pp rows."""
    pp = inputs.pp
    stages = make_grid({k: [v] * pp for k, v in inputs.grid_config.items()})
    by_stage = estimate(
        inputs.spec,
        stages,
        usable_bytes=inputs.profile.usable_bytes,
        headroom=job.headroom,
        overheads=ov,
        pp_stage=np.arange(pp),
    )
    return [stage_summary(by_stage, row=k) for k in range(pp)]


def _risk_block(job: _EstimateJob, inputs: _EstimateInputs, ov: Overheads) -> dict[str, Any]:
    """`--lengths`: the `risk` block, the OOM risk of an epoch over the dataset (report/_risk.py),
    and issue 28's keys of it at the top level (`risk_keys`); nothing without a dataset."""
    data = check_risk_options(
        job.lengths, job.lengths_histogram, batching=job.batching, risk=job.risk
    )
    if data is None:
        return {}
    (block,) = risk_answers(
        inputs.spec,
        inputs.grid_config,
        data,
        batching=job.batching,
        buckets=job.buckets,
        risk=job.risk,
        micro_batches=np.array([inputs.config["micro_batch_size"]]),
        usable_bytes=inputs.profile.usable_bytes,
        headroom=job.headroom,
        overheads=ov,
    )
    return risk_keys(block)


class NodeHost(NamedTuple):
    """The host RAM of rows on one GPU type's nodes (columns, one value per row; limit one)."""

    limit_bytes: int | None
    """A node's host RAM: `--host-memory-gib`, else the profile's; None when unknown."""
    ranks: np.ndarray
    """Ranks on one node (ranks_per_node)."""
    need_bytes: np.ndarray
    """Host RAM the node's ranks need (node_host_bytes)."""
    fits: np.ndarray
    """need <= limit (no limit known: fits)."""


def node_host(
    host_bytes: Any, num_gpus: Any, profile: GpuProfile, host_memory_gib: float | None
) -> NodeHost:
    """Whether the ranks on one node fit its host RAM (what CPU offload moves there), per row:
    fit's candidates and estimate's one row alike."""
    limit = gib_to_bytes(host_memory_gib) or profile.host_memory_bytes
    ranks = ranks_per_node(np.asarray(num_gpus), profile.gpus_per_node)
    need = node_host_bytes(np.asarray(host_bytes), ranks)
    return NodeHost(limit, ranks, need, need <= (np.inf if limit is None else limit))


def host_fit(
    host_bytes: float, num_gpus: int, profile: GpuProfile, host_memory_gib: float | None
) -> dict[str, Any]:
    """node_host of one configuration as the keys `fit --json` has too. `fits` of a report is
    its GPU fit and this."""
    host = node_host(host_bytes, num_gpus, profile, host_memory_gib)
    return {
        "host_memory_per_node_bytes": host.limit_bytes,
        "node_host_bytes": int(round(float(host.need_bytes))),
        "ranks_per_node": int(host.ranks),
        "host_fits": bool(host.fits),
    }


def host_reason(need_bytes: float, limit_bytes: float | None, ranks: int) -> str:
    """Why a configuration that fits its GPUs does not fit its node: the host RAM its ranks
    need (CPU offload) against what the node has."""
    return (
        f"host memory: the node's {ranks} ranks need {need_bytes / GIB:.2f} GiB of host memory, "
        f"the node has {(limit_bytes or 0) / GIB:.2f} GiB"
    )


def _one_row(values: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """estimate_one()'s scalars as estimate()'s one-row columns (the report reads those)."""
    return {k: np.array([v], dtype=OUTPUT_DTYPES.get(k, np.float64)) for k, v in values.items()}
