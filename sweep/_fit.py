"""`trainmem fit`: the largest micro-batch (or fewest GPUs) of a job that fits, as a dict.

Bad input raises ValueError (one line naming the field).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainmem.engine import (
    DEFAULTS,
    Overheads,
    TimeParams,
    cublas_workspace_bytes_for,
    estimate,
    estimate_time,
    make_grid,
    optimizer_columns,
    reason_text,
    time_inputs,
)
from trainmem.hardware import get_gpu
from trainmem.report import (
    MINIMIZE,
    advice_report,
    check_choices,
    check_headroom,
    choice,
    jsonable,
    model_spec,
    row_report,
    time_report,
    traced_choices,
)


def fit_report(
    *,
    model: str,
    gpu: str,
    num_gpus: int,
    seq_len: int,
    micro_batch_size: int,
    global_batch_size: int,
    precision: str,
    optimizer: str,
    recompute: str,
    attention: str,
    zero: int,
    tp: int,
    pp: int,
    virtual_stages: int,
    cp: int,
    sequence_parallel: bool,
    framework: str,
    ep: int,
    offload: str,
    lora_rank: int,
    lora_targets: str,
    qlora: bool,
    loss: str,
    headroom: float,
    hardware_dir: str | None,
    minimize: str,
    max_micro_batch_size: int,
    max_num_gpus: int,
    models_dir: str | None,
    optimizers_dir: str | None,
    profile_file: str | None = None,
) -> dict[str, Any]:
    """`trainmem fit --json`: the largest micro-batch (or fewest GPUs) that fits, its estimate,
    and the advice when nothing fits."""
    optimizer_fields = optimizer_columns(optimizer, optimizers_dir)
    check_choices({"precision": precision, "recompute": recompute, "attention": attention,
                   "framework": framework, "offload": offload, "loss": loss})  # fmt: skip
    choice("minimize", minimize, MINIMIZE)
    check_headroom(headroom)
    if max_micro_batch_size < 1 or max_num_gpus < 1:
        raise ValueError("max-micro-batch-size and max-num-gpus must be >= 1")
    spec = model_spec(model, models_dir=models_dir, profile_file=profile_file)
    precision, recompute, attention = traced_choices(spec, precision, recompute, attention)
    profile = get_gpu(gpu, hardware_dir)
    config: dict[str, Any] = {
        "micro_batch_size": micro_batch_size, "seq_len": seq_len, "num_gpus": num_gpus,
        "global_batch_size": global_batch_size, "tp": tp, "pp": pp, "cp": cp,
        "virtual_stages": virtual_stages, "zero": zero, "sequence_parallel": sequence_parallel,
        "precision": precision, "optimizer": optimizer, "recompute": recompute,
        "attention": attention, "framework": framework, "ep": ep, "offload": offload,
        "lora_rank": lora_rank, "lora_targets": lora_targets, "qlora": qlora, "loss": loss,
    }  # fmt: skip
    config.update(optimizer_fields)
    key = "micro_batch_size" if minimize == "micro-batch-size" else "num_gpus"
    if key == "micro_batch_size":
        candidates = np.arange(1, max_micro_batch_size + 1)
    else:
        step = max(tp * pp * cp, 1)
        candidates = np.arange(step, max(max_num_gpus, step) + 1, step)
    grid = make_grid({**config, key: candidates})
    ov = Overheads(cublas_workspace_bytes=cublas_workspace_bytes_for(profile.arch))
    out = estimate(spec, grid, usable_bytes=profile.usable_bytes, headroom=headroom, overheads=ov)
    fitting = np.flatnonzero(out["fits"])
    if len(fitting):
        row = int(fitting[-1] if key == "micro_batch_size" else fitting[0])
    else:  # nothing fits: report the closest candidate (most headroom) and why
        valid = np.flatnonzero(out["reason"] == 0)
        row = int(valid[np.argmax(out["headroom_bytes"][valid])]) if len(valid) else 0
    chosen = {**config, key: int(candidates[row])}
    report = row_report(spec, {k: np.asarray(v)[row : row + 1] for k, v in out.items()},
                        gpu=profile, config=chosen, headroom=headroom)  # fmt: skip
    one = make_grid(chosen)
    timing = estimate_time(spec, one, **time_inputs(profile))
    report["time"] = time_report(timing, price_per_gpu_hour_usd=profile.price_per_hour_usd)
    answer_key = "max_micro_batch_size" if key == "micro_batch_size" else "min_num_gpus"
    answer = int(candidates[row]) if len(fitting) else None
    result = {
        answer_key: answer,
        "fits": bool(len(fitting)),
        "reason": reason_text(out["reason"][row]) or ("" if len(fitting) else "does not fit"),
        "estimate": report,
    }
    if not len(fitting) and out["reason"][row] == 0:
        # Nothing fits: the same advice `estimate` gives, from the closest candidate.
        result.update(
            advice_report(
                spec, {**DEFAULTS, **chosen}, profile=profile,
                out={k: np.asarray(v)[row : row + 1] for k, v in out.items()},
                headroom=headroom, overheads=ov, overhead_overrides={},
                time_params=TimeParams(), hardware_dir=hardware_dir, optimizer_name=optimizer,
            )
        )  # fmt: skip
    return jsonable(result)
