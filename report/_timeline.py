"""The step's allocated memory over time, moment by moment, from one estimate's own numbers.

`estimate` gives the three phase peaks and what is alive at the step's peak; a picture of the
step (`trainmem estimate --plot`, `--memory-viz`) needs the moments between them. The timeline
walks the worst rank's step: the forward block by block (activations saved per layer), the loss,
the backward block by block (activations released, gradients growing; the recompute moment),
the optimizer step and the step's end. Each moment holds the states, gradients and activations
of the report (capped so that no moment exceeds its phase's peak), and the phase's peak moment
takes the rest of its peak as `transient`: the timeline's largest total is the phase peak of
each phase and the step's `peak_allocated_bytes`, exactly. Between the peaks the split is drawn
from the report's per-layer terms (linear in the layer), not simulated tensor by tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from trainmem.hardware._files import check_path_name

from ._options import Option

TIMELINE_COMPONENTS = (
    "parameters",
    "master_weights",
    "optimizer_states",
    "gradients",
    "activations",
    "transient",
)
"""The stacked bands, bottom to top; also the order in which they are capped at a phase peak."""

PLOT_FORMATS = ("png", "svg")
"""The picture types `--plot` writes, chosen by the file's extension."""

MEMORY_VIZ_SUFFIXES = ("pickle", "pkl")
"""`--memory-viz` writes a pickle, as torch.cuda.memory._dump_snapshot does."""

PICTURE_OPTIONS = (
    Option(
        name="plot",
        type=str | None,
        default=None,
        http=False,
        help=(
            "Draw the step's allocated memory over time (forward, loss, backward, optimizer "
            "step; components stacked; the GPU's limit) to FILE.png or FILE.svg."
        ),
    ),
    Option(
        name="memory_viz",
        type=str | None,
        default=None,
        http=False,
        help=(
            "Write the step's predicted allocations as a PyTorch memory snapshot, FILE.pickle "
            "(python -m torch.cuda._memory_viz trace_plot FILE -o out.html)."
        ),
    ),
)
"""`trainmem estimate`'s picture outputs (the CLI only: they name files)."""


def picture_suffix(flag: str, path: str, allowed: tuple[str, ...]) -> str:
    """The extension of `path` (lower case, no dot) when it is one of `allowed`; else one
    ValueError line naming `flag` and the allowed suffixes (checked before any work), or the
    file system's limit on a name's length."""
    check_path_name(path, what=flag)
    suffix = path.rsplit(".", 1)[-1].lower() if "." in path.rsplit("/", 1)[-1] else ""
    if suffix not in allowed:
        names = ", ".join(f".{s}" for s in allowed)
        raise ValueError(f"{flag}: unknown extension of {path!r}; allowed: {names}")
    return suffix


def stage_blocks(num_hidden_layers: int, pp: int) -> int:
    """Transformer blocks on a pipeline stage: ceil(L / pp), at least one.
    Source: engine/_pipeline.py (layers per stage)."""
    return max(-(-int(num_hidden_layers) // max(int(pp), 1)), 1)


def _moment_plan(report: Mapping[str, Any], num_blocks: int) -> list[tuple[str, str, float, float]]:
    """(label, phase, activations as a fraction of the saved activations' span past what is
    saved outside the blocks (-1: none), gradient stage (0 as in forward, 1 all)) of each
    moment, in step order. Each phase's peak moment is labelled with a `*`: the loss; the
    recompute moment, else backward's start; the optimizer step."""
    recompute = report["config"].get("recompute", "none") != "none"
    L = num_blocks
    plan: list[tuple[str, str, float, float]] = [("start", "forward", -1.0, 0)]
    plan += [(f"forward block {k}", "forward", k / L, 0) for k in range(1, L + 1)]
    plan.append(("*loss", "forward", 1.0, 0))
    plan.append(("backward start" if recompute else "*backward start", "backward", 1.0, 0))
    if recompute:
        plan.append(("*recompute block", "backward", 1.0, 0))
    plan += [
        (f"backward block {k}", "backward", (k - 1) / L, (L - k + 1) / L) for k in range(L, 0, -1)
    ]
    plan.append(("embedding backward", "backward", -1.0, 1))
    plan.append(("*optimizer step", "optimizer_step", -1.0, 1))
    plan.append(("step end", "optimizer_step", -1.0, 0))
    return plan


def _capped(parts: list[float], limit: float) -> list[float]:
    """`parts` taken in order up to `limit`: each at most what the ones before it leave."""
    out, left = [], limit
    for part in parts:
        take = min(max(part, 0.0), max(left, 0.0))
        out.append(take)
        left -= take
    return out


def _forward_gradients(report: Mapping[str, Any]) -> float:
    """Gradients alive during the forward: the report's at-peak gradients when the peak is in
    forward or backward (what those phases hold); at an optimizer-step peak, all of them where
    they persist across the step (accumulation, a pipeline), else none.
    Ignores: a persistent gradient buffer at an optimizer-step peak (drawn as transient)."""
    if report["peak_phase"] != "optimizer_step":
        return float(report["breakdown_at_peak"]["gradients"])
    details = report["details"]
    persist = details["num_microbatches"] > 1 or report["config"].get("pp", 1) > 1
    return float(report["bytes"]["gradients"]) if persist else 0.0


def step_timeline(report: Mapping[str, Any], *, num_blocks: int) -> dict[str, Any]:
    """The worst rank's step as moments (an `estimate --json` report in): `moments` and
    `phases` (labels), one int64 array of bytes per TIMELINE_COMPONENTS and their `total_bytes`,
    `peak_moment` (index of the step's peak) and the limits to draw (`usable_bytes`,
    `limit_bytes` = usable less the headroom, device bytes at the step's peak less the
    allocated ones: `outside_allocated_bytes`).

    Each phase's largest total is its peak in `report["phases"]`, and the largest of all is
    `peak_allocated_bytes` (integers, exactly)."""
    at_peak, details = report["breakdown_at_peak"], report["details"]
    states = [float(at_peak[k]) for k in ("parameters", "master_weights", "optimizer_states")]
    grads_forward, grads_all = _forward_gradients(report), float(report["bytes"]["gradients"])
    saved = float(report["bytes"]["activations"])
    first = min(float(details["activations_outside_layers"]), saved)  # alive before block 1
    rows: dict[str, list[float]] = {k: [] for k in TIMELINE_COMPONENTS}
    labels, phases = [], []
    for label, phase, act_share, grad_share in _moment_plan(report, num_blocks):
        peak = float(report["phases"][phase])
        acts = 0.0 if act_share < 0 else first + (saved - first) * act_share
        grads = grads_forward + (grads_all - grads_forward) * grad_share
        parts = _capped([*states, np.floor(grads), np.floor(acts)], peak)
        parts.append(peak - sum(parts) if label.startswith("*") else 0.0)
        for k, v in zip(TIMELINE_COMPONENTS, parts, strict=True):
            rows[k].append(v)
        labels.append(label.lstrip("*"))
        phases.append(phase)
    columns = {k: np.asarray(v, dtype=np.int64) for k, v in rows.items()}
    total = np.sum([columns[k] for k in TIMELINE_COMPONENTS], axis=0)
    usable = int(report["gpu"]["usable_bytes"])
    return {
        "moments": labels,
        "phases": phases,
        **columns,
        "total_bytes": total,
        "peak_moment": int(np.argmax(total)),
        "usable_bytes": usable,
        "limit_bytes": int(usable * (1.0 - float(report["headroom"]))),
        "outside_allocated_bytes": int(
            report["peak_device_bytes"] - report["peak_allocated_bytes"]
        ),
        "title": _title(report),
    }


def _title(report: Mapping[str, Any]) -> str:
    """What the picture is of: model, GPUs, the main layout knobs."""
    c = report["config"]
    return (
        f"{report['model']} on {c['num_gpus']} x {report['gpu']['name']}: micro-batch "
        f"{c['micro_batch_size']}, seq {c['seq_len']}, zero {c['zero']}, tp {c['tp']}, pp "
        f"{c['pp']}, recompute {c['recompute']}, {c['precision']} (rank of stage "
        f"{report.get('pp_stage', 0)})"
    )
