"""`trainmem fit`: the largest micro-batch (or fewest GPUs) of a job that fits, as a dict.

Bad input raises ValueError (one line naming the field).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from trainmem.catalog import optimizer_columns
from trainmem.engine import (
    DEFAULTS,
    TimeParams,
    TrainingConfig,
    estimate,
    estimate_time,
    make_grid,
    overheads_for,
    reason_text,
    time_inputs,
)
from trainmem.hardware import get_gpu
from trainmem.report import (
    AS_JSON,
    CHECK,
    DEFAULT_MODEL,
    FAMILY,
    GPU,
    HEADROOM,
    HOST_MEMORY_GIB,
    MINIMIZE,
    MODEL,
    PROFILE_FILE,
    USER_DIRS,
    Option,
    advice_report,
    check_headroom,
    check_options,
    choice,
    host_reason,
    jsonable,
    model_spec,
    node_host,
    row_report,
    time_report,
    traced_choices,
    training_config,
    training_options,
)

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
    MODEL,
    FAMILY,
    GPU,
    *training_options(),
    HEADROOM,
    HOST_MEMORY_GIB,
    *USER_DIRS,
    *MINIMIZE_OPTIONS,
    PROFILE_FILE,
    AS_JSON,
    CHECK,
)
"""`trainmem fit`, `POST /v1/fit`, `trainmem.fit`."""


def fit_report(
    training: TrainingConfig | Mapping[str, Any] | None = None,
    *,
    model: str = DEFAULT_MODEL,
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
    **fields: Any,
) -> dict[str, Any]:
    """`trainmem fit --json`: the largest micro-batch (or fewest GPUs) that fits, its estimate,
    and the advice when nothing fits.

    The job is `training` updated by keyword training fields (as `estimate_report`); the
    searched field (micro_batch_size or num_gpus) is replaced by the candidates.
    """
    values = training_config(training, fields)
    optimizer = values["optimizer"]
    optimizer_fields = optimizer_columns(optimizer, optimizers_dir)
    config_ = TrainingConfig.from_fields(values)
    choice("minimize", minimize, MINIMIZE)
    check_headroom(headroom)
    check_options(
        (*MINIMIZE_OPTIONS, HOST_MEMORY_GIB),
        {
            "max_micro_batch_size": max_micro_batch_size,
            "max_num_gpus": max_num_gpus,
            "host_memory_gib": host_memory_gib,
        },
    )
    spec = model_spec(model, models_dir=models_dir, profile_file=profile_file, family=family)
    precision, recompute, attention = traced_choices(
        spec, config_.precision, config_.recompute, config_.attention
    )
    config_ = config_.replace(precision=precision, recompute=recompute, attention=attention)
    tp, pp, cp = config_.tp, config_.pp, config_.cp
    profile = get_gpu(gpu, hardware_dir)
    config: dict[str, Any] = config_.grid_columns()
    config.update(optimizer_fields)
    key = "micro_batch_size" if minimize == "micro-batch-size" else "num_gpus"
    if key == "micro_batch_size":
        candidates = np.arange(1, max_micro_batch_size + 1)
    else:
        step = max(tp * pp * cp, 1)
        candidates = np.arange(step, max(max_num_gpus, step) + 1, step)
    grid = make_grid({**config, key: candidates})
    ov = overheads_for(profile.arch, cuda_context_bytes=profile.cuda_context_bytes)
    out = estimate(spec, grid, usable_bytes=profile.usable_bytes, headroom=headroom, overheads=ov)
    host_limit, ranks, node_need, host_fits = node_host(
        np.maximum(out["host_bytes"], out["load_host_bytes"]),
        grid["num_gpus"],
        profile,
        host_memory_gib,
    )
    fitting = np.flatnonzero(out["fits"] & host_fits)
    if len(fitting):
        row = int(fitting[-1] if key == "micro_batch_size" else fitting[0])
    else:  # nothing fits: report the closest candidate (most headroom) and why
        valid = np.flatnonzero(out["reason"] == 0)
        row = int(valid[np.argmax(out["headroom_bytes"][valid])]) if len(valid) else 0
    chosen = {**config, key: int(candidates[row])}
    report = row_report(
        spec,
        {k: np.asarray(v)[row : row + 1] for k, v in out.items()},
        gpu=profile,
        config=chosen,
        headroom=headroom,
    )
    one = make_grid(chosen)
    timing = estimate_time(spec, one, **time_inputs(profile))
    report["time"] = time_report(timing, price_per_gpu_hour_usd=profile.price_per_hour_usd)
    answer_key = "max_micro_batch_size" if key == "micro_batch_size" else "min_num_gpus"
    answer = int(candidates[row]) if len(fitting) else None
    reason = reason_text(out["reason"][row])
    # The host's memory is the reason only where the GPU holds the job (step and load).
    if not reason and not len(fitting) and out["fits"][row] and not host_fits[row]:
        reason = host_reason(float(node_need[row]), host_limit, int(ranks[row]))
    result = {
        answer_key: answer,
        "fits": bool(len(fitting)),
        "reason": reason or ("" if len(fitting) else "does not fit"),
        "estimate": report,
        "host_memory_per_node_bytes": host_limit,
        "node_host_bytes": int(round(float(node_need[row]))),
        "host_fits": bool(host_fits[row]),
    }
    if not len(fitting) and out["reason"][row] == 0 and not out["fits"][row]:
        # The closest candidate's peak and how far it is over the limit (usable x (1 - headroom)).
        result["closest_peak_device_bytes"] = int(report["peak_device_bytes"])
        result["shortfall_bytes"] = int(-report["headroom_bytes"])
        # Nothing fits: the same advice `estimate` gives, from the closest candidate.
        result.update(
            advice_report(
                spec,
                {**DEFAULTS, **chosen},
                profile=profile,
                out={k: np.asarray(v)[row : row + 1] for k, v in out.items()},
                headroom=headroom,
                overheads=ov,
                overhead_overrides={},
                time_params=TimeParams(),
                hardware_dir=hardware_dir,
                optimizer_name=optimizer,
            )
        )
    return jsonable(result)
