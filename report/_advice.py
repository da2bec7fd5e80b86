"""The advice block of `trainmem estimate`: single-knob changes and the top memory consumers."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from trainmem.engine import (
    GIB,
    GpuChoice,
    ModelSpec,
    Overheads,
    TimeParams,
    advise,
    overheads_for,
    time_inputs,
    top_consumers,
)
from trainmem.hardware import GpuProfile, load_gpus

from ._validate import precision_reason

HUMAN_MAX_CHANGES = 5
"""How many ranked changes the human output lists."""
HUMAN_MAX_CONSUMERS = 3


def gpu_choice(
    profile: GpuProfile,
    *,
    workspace_override: float | None = None,
    context_override: float | None = None,
) -> GpuChoice:
    """A GPU profile as the engine's advice needs it: its own cuBLAS workspace and CUDA context
    (`overheads_for`), unless `--overhead` set them for every GPU."""
    own = overheads_for(profile.arch, cuda_context_bytes=profile.cuda_context_bytes)
    workspace = own.cublas_workspace_bytes if workspace_override is None else workspace_override
    context = own.cuda_context_bytes if context_override is None else context_override
    return GpuChoice(
        name=profile.name,
        usable_bytes=float(profile.usable_bytes),
        cublas_workspace_bytes=float(workspace),
        cuda_context_bytes=float(context),
        time_kwargs=time_inputs(profile),
    )


def advice_report(
    spec: ModelSpec,
    config: dict[str, Any],
    *,
    profile: GpuProfile,
    out: dict[str, np.ndarray],
    headroom: float,
    overheads: Overheads,
    overhead_overrides: dict[str, float],
    time_params: TimeParams,
    hardware_dir: str | None,
    optimizer_name: str | None = None,
    changes: bool = True,
    step_config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """{"advice": [...], "top_consumers": [...]} for `estimate --json` (see README, "Advice");
    `changes` False (--no-advice): the top consumers only, no search of changes. `step_config`:
    the configuration `out` was estimated on where it is not the job's `config` (an RL
    trainer's micro-batches); the changes are the job's."""
    consumers = [
        {"what": what, "bytes": int(round(num_bytes))}
        for what, num_bytes in top_consumers(
            spec, step_config or config, out, optimizer_name=optimizer_name
        )
    ]
    if not changes:
        return {"top_consumers": consumers}
    overrides = {
        "workspace_override": overhead_overrides.get("cublas_workspace_bytes"),
        "context_override": overhead_overrides.get("cuda_context_bytes"),
    }
    current = gpu_choice(profile, **overrides)
    catalogue = [
        gpu_choice(g, **overrides)
        for g in sorted(load_gpus(hardware_dir).values(), key=lambda g: g.usable_bytes)
        if precision_reason(str(config["precision"]), g) is None  # never a GPU it cannot run on
    ]
    result = advise(
        spec,
        config,
        gpu=current,
        catalogue=catalogue,
        headroom=headroom,
        overheads=overheads,
        time_params=time_params,
        optimizer_name=optimizer_name,
    )
    advice = [
        {
            "change": a["change"],
            "knob": a["knob"],
            "saved_bytes": a["saved_bytes"],
            "fits": a["fits"],
            "step_time_ratio": None if math.isnan(a["step_time_ratio"]) else a["step_time_ratio"],
            "peak_device_bytes": a["peak_device_bytes"],
            "gpu": a["gpu"],
            "changes": a["changes"],
            "config": a["config"],
        }
        for a in result["advice"]
    ]
    return {"advice": advice, "top_consumers": consumers}


def _ratio(a: dict[str, Any]) -> str:
    r = a["step_time_ratio"]
    if r is None:
        return "step time not modelled"
    untimed = " (activation offload not timed)" if a["changes"].get("activation_offload") else ""
    return f"step time x{r:.2f}{untimed}"


def advice_lines(report: dict[str, Any]) -> list[str]:
    """The human advice section: when the job does not fit, the changes on the same GPU that make
    it fit (ranked as in the JSON) and the larger GPUs it fits on; then the top consumers."""
    if "top_consumers" not in report:
        return []
    lines = [""]
    if not report["fits"] and "advice" in report:
        lines += change_lines(report["advice"])
    lines.append("  top memory consumers at the peak:")
    for c in report["top_consumers"][:HUMAN_MAX_CONSUMERS]:
        lines.append(f"    {c['what']}: {c['bytes'] / GIB:.2f} GiB")
    return lines


def _gpu_text(a: dict[str, Any]) -> str:
    r = a["step_time_ratio"]
    return a["gpu"] if r is None else f"{a['gpu']} (step time x{r:.2f})"


def change_lines(advice: list[dict[str, Any]]) -> list[str]:
    """What to change when a job does not fit (estimate, fit): the memory changes on the same
    GPU first (least slowdown first, as ranked in the JSON; else the largest savings), then the
    GPUs it fits on as it is, on one line."""
    fitting = [a for a in advice if a["fits"]]
    same_gpu = [a for a in fitting if a["knob"] != "gpu"]
    gpus = [a for a in fitting if a["knob"] == "gpu"]
    lines = []
    if any("+" not in a["knob"] for a in same_gpu):
        lines.append("  changes that make it fit (least slowdown first):")
    elif same_gpu:
        lines.append("  no single change makes it fit; these together do (least slowdown first):")
    else:
        lines.append("  no change of up to three knobs makes it fit; the largest savings:")
        same_gpu = sorted(
            (a for a in advice if a["knob"] != "gpu"), key=lambda a: -a["saved_bytes"]
        )
    shown = same_gpu[:HUMAN_MAX_CHANGES]
    for a in shown:
        lines.append(f"    {a['change']}: saves {a['saved_bytes'] / GIB:.2f} GiB, {_ratio(a)}")
    if len(same_gpu) > len(shown) and any(a["fits"] for a in same_gpu):
        lines.append(f"    ... and {len(same_gpu) - len(shown)} more (--json: advice)")
    if gpus:
        lines.append(f"  it fits as it is on: {', '.join(_gpu_text(a) for a in gpus)}")
    return lines
