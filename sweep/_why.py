"""Why the best point wins: its step time in parts next to the best *conventional* layout's
(tensor parallel over a node's GPUs, no context parallelism, no CPU offload, the layout most
teams would write by hand), and the parts that make the difference.

A sweep's optimum can be a layout nobody would run without a reason (tp 1 x pp 16 x cp 4 for a
70B model); this block gives the reason in the model's own terms (seconds of exposed tensor-
parallel communication, of pipeline bubble, of offload traffic), so a person can check it before
trusting it. The conventional layout is the exact optimum of the conventional part of the same
space (an in-memory exhaustive search of that sub-space), by the same objective.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from trainmem.hardware import GIB

from ._exhaustive import run_exhaustive
from ._space import AXES, Space, evaluate_columns, rows_on_pools

CONVENTIONAL = "tp = a node's GPUs, cp 1, no CPU offload"
"""The conventional layout, in words (the JSON's `why.conventional_rule` adds which GPUs)."""
CONVENTIONAL_FALLBACK = "tp within a node, cp 1, no CPU offload"
"""The rule used when no point with tp = a node's GPUs fits (or tp is pinned)."""
STEP_PARTS = (
    ("compute", "compute (GEMM, attention, memory-bound)"),
    ("optimizer_time_s", "optimizer step"),
    ("tp_exposed_s", "exposed tensor-parallel communication"),
    ("cp_exposed_s", "exposed context-parallel communication"),
    ("pp_p2p_s", "pipeline send/receive"),
    ("bubble_time_s", "pipeline bubble"),
    ("dp_exposed_s", "exposed data-parallel gradient reduction"),
    ("fsdp_exposed_s", "exposed ZeRO/FSDP gathers"),
    ("offload_s", "CPU offload traffic"),
    ("expert_s", "exposed expert-parallel all-to-all"),
    ("rl_rollout_s", "RL rollout generation"),
    ("rl_score_s", "RL score forwards (old policy, reference, values)"),
    ("rl_critic_s", "RL critic update"),
    ("rl_sync_s", "RL weight sync to the rollout engine"),
    ("rl_offload_s", "RL offload between phases"),
)
"""The parts of a step (engine estimate_time columns; `compute` = compute_time_s minus the
optimizer step), which add up to step_time_s, with their labels."""
TIME_PART_COLUMNS = (
    "compute_time_s",
    "optimizer_time_s",
    "tp_exposed_s",
    "cp_exposed_s",
    "pp_p2p_s",
    "bubble_time_s",
    "dp_exposed_s",
    "fsdp_exposed_s",
    "offload_s",
    "expert_s",
    "rl_rollout_s",
    "rl_score_s",
    "rl_critic_s",
    "rl_sync_s",
    "rl_offload_s",
)
LAYOUT_FIELDS = AXES[1:]
"""The fields that name a point (besides its GPU): the swept axes after the pool."""
MIN_SHOWN_S = 0.05
"""Differences smaller than this share of the conventional step are not named (noise-level
parts); the two largest are always named."""


def conventional_space(
    space: Space, best: Mapping[str, Any], *, strict: bool = True, same_count: bool = True
) -> Space | None:
    """The conventional part of `space` on the best point's GPU type: no CPU offload, cp 1,
    (`strict`) tp equal to a node's GPU count, (`same_count`) the best point's GPU count; None
    when the space holds no such point (an axis pinned elsewhere)."""
    pools = tuple(i for i, p in enumerate(space.fleet.pools) if p.gpu == best["gpu"])
    keep: dict[str, tuple[Any, ...]] = {"pool": pools, "offload": ("none",), "cp": (1,)}
    if strict:
        keep["tp"] = tuple(sorted({space.fleet.pools[i].gpus_per_node for i in pools}))
    if same_count:
        keep["num_gpus"] = (best["num_gpus"],)
    axes = dict(space.axes)
    for axis, allowed in keep.items():
        axes[axis] = tuple(v for v in space.axes[axis] if v in allowed)
        if not axes[axis]:
            return None
    return dataclasses.replace(space, axes=axes)


def is_conventional(space: Space, row: Mapping[str, Any]) -> bool:
    """Whether `row` follows the strict conventional rule (CONVENTIONAL)."""
    per_node = {p.gpus_per_node for p in space.fleet.pools if p.gpu == row["gpu"]}
    return row["offload"] == "none" and row["cp"] == 1 and row["tp"] in per_node


RULES = (
    (True, True, f"{CONVENTIONAL}, same GPUs"),
    (False, True, f"{CONVENTIONAL_FALLBACK}, same GPUs"),
    (True, False, f"{CONVENTIONAL}, same GPU type"),
    (False, False, f"{CONVENTIONAL_FALLBACK}, same GPU type"),
)
"""The conventional rules tried in turn (strict tp, same GPU count, words): the first with a
fitting point is the comparison. Same GPUs first, so that the step's parts compare like with
like."""


def best_conventional(
    space: Space, best: Mapping[str, Any], objectives: tuple[str, ...]
) -> tuple[dict | None, str]:
    """The best fitting conventional point under the first rule of RULES that has one, and the
    rule's words; (None, the strict rule) when no conventional point fits."""
    for strict, same_count, rule in RULES:
        sub = conventional_space(space, best, strict=strict, same_count=same_count)
        if sub is None or not sub.num_points:
            continue
        found = run_exhaustive(sub, out=None, study="why", objectives=objectives, top=1)
        if found.best:
            return found.best[0], rule
    return None, RULES[0][2]


def step_parts(space: Space, rows: list[Mapping[str, Any]]) -> list[dict[str, float]]:
    """Each row's step-time parts (STEP_PARTS keys, seconds) and step_time_s, evaluated again
    in one call on the first pool of its GPU type that holds it and gives its step time."""
    cand, cols = rows_on_pools(space, rows)
    res = evaluate_columns(space, cols, columns=("fits",), time_columns=TIME_PART_COLUMNS)
    out = []
    for k, row in enumerate(rows):
        mine = [j for j, (kk, _) in enumerate(cand) if kk == k]
        j = min(mine, key=lambda r: abs(float(res["step_time_s"][r]) - row["step_time_s"]))
        parts = {key: float(res[key][j]) for key, _ in STEP_PARTS if key != "compute"}
        parts["compute"] = float(res["compute_time_s"][j]) - parts["optimizer_time_s"]
        out.append({**{key: parts[key] for key, _ in STEP_PARTS}, "step_time_s": _step(res, j)})
    return out


def _step(res: Mapping[str, np.ndarray], j: int) -> float:
    return float(res["step_time_s"][j])


def why(space: Space, best: Mapping[str, Any], objectives: tuple[str, ...]) -> dict[str, Any]:
    """The `why` block of a sweep's best point (JSON-ready; `why_lines` prints it)."""
    conventional, rule = best_conventional(space, best, objectives)
    if conventional is not None and all(
        conventional[k] == best[k] for k in ("gpu", *LAYOUT_FIELDS)
    ):
        conventional = None  # the best point is itself the conventional optimum
    rows = [best] if conventional is None else [best, conventional]
    parts = step_parts(space, rows)
    block: dict[str, Any] = {
        "conventional_rule": rule,
        "best_is_conventional": is_conventional(space, best),
        "best": _side(best, parts[0]),
        "conventional": None if conventional is None else _side(conventional, parts[1]),
        "differences": [],
    }
    if conventional is not None:
        block["differences"] = _differences(parts[0], parts[1])
        block["layout_changes"] = {
            k: [conventional[k], best[k]]
            for k in ("gpu", *LAYOUT_FIELDS)
            if conventional[k] != best[k]
        }
    block["summary"] = _summary(block)
    return block


def _side(row: Mapping[str, Any], parts: Mapping[str, float]) -> dict[str, Any]:
    return {
        "configuration": {k: row[k] for k in ("gpu", *LAYOUT_FIELDS)},
        "cost_per_million_tokens": row["cost_per_million_tokens"],
        "step_time_s": row["step_time_s"],
        "peak_device_bytes": row["peak_device_bytes"],
        "step_parts_s": {k: parts[k] for k, _ in STEP_PARTS},
    }


def _differences(best: Mapping[str, float], other: Mapping[str, float]) -> list[dict[str, Any]]:
    """The parts by how much the conventional layout spends more than the best (largest
    first): saved_s > 0 where the best point is faster."""
    rows: list[dict[str, Any]] = [
        {
            "part": key,
            "label": label,
            "best_s": best[key],
            "conventional_s": other[key],
            "saved_s": other[key] - best[key],
        }
        for key, label in STEP_PARTS
    ]
    return sorted(rows, key=lambda r: -abs(r["saved_s"]))


def _summary(block: Mapping[str, Any]) -> str:
    """One sentence: what the best point gains over the conventional one, and from where."""
    best, conv = block["best"], block["conventional"]
    if conv is None:
        if block["best_is_conventional"]:
            return f"The best point is the best conventional layout ({block['conventional_rule']})."
        return f"No conventional layout ({block['conventional_rule']}) fits."
    step = conv["step_time_s"]
    named = [
        d
        for i, d in enumerate(block["differences"])
        if abs(d["saved_s"]) > 0 and (i < 2 or abs(d["saved_s"]) >= MIN_SHOWN_S * step)
    ][:4]
    gains = "; ".join(
        f"{d['label']} {abs(d['saved_s']):.2f} s {'less' if d['saved_s'] > 0 else 'more'}"
        for d in named
    )
    cost = _ratio(conv["cost_per_million_tokens"], best["cost_per_million_tokens"])
    changes = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in block["layout_changes"].items())
    return (
        f"{cost} than the best conventional layout ({changes}); per step: {gains}."
        if gains
        else f"{cost} than the best conventional layout ({changes})."
    )


def _ratio(conventional: float, best: float) -> str:
    if not (math.isfinite(conventional) and math.isfinite(best)) or best <= 0:
        return "Not comparable"
    pct = (conventional / best - 1) * 100
    return f"{pct:.1f}% cheaper per token" if pct >= 0 else f"{-pct:.1f}% dearer per token"


def why_lines(block: Mapping[str, Any]) -> list[str]:
    """The block as text lines for the sweep's table output."""
    best, conv = block["best"], block["conventional"]
    sides = [("best", best)] + ([("conventional", conv)] if conv is not None else [])

    def line(label: str, cells: list[str]) -> str:
        return f"  {label:<42}" + "".join(f"{c:>20}" for c in cells)

    lines = [f"why this one: {block['summary']}", line("", [name for name, _ in sides])]
    lines.append(line("layout", [_layout(s["configuration"]) for _, s in sides]))
    lines.append(
        line("$ per million tokens", [f"{s['cost_per_million_tokens']:.4g}" for _, s in sides])
    )
    lines.append(line("peak GiB", [f"{s['peak_device_bytes'] / GIB:.2f}" for _, s in sides]))
    lines.append(line("step s", [f"{s['step_time_s']:.3f}" for _, s in sides]))
    for key, label in STEP_PARTS:
        values = [s["step_parts_s"][key] for _, s in sides]
        if any(abs(v) >= 5e-4 for v in values):
            lines.append(line("  " + label, [f"{v:.3f}" for v in values]))
    return lines


def _layout(c: Mapping[str, Any]) -> str:
    """A point's layout in a few characters: ``64 t1p16c4z2 mb1``, v (virtual stages) and e
    (expert parallel) when above 1, a trailing ``+off`` with CPU offload."""
    v = f"v{c['virtual_stages']}" if c["virtual_stages"] > 1 else ""
    e = f"e{c['ep']}" if c["ep"] > 1 else ""
    off = "+off" if c["offload"] != "none" else ""
    layout = f"t{c['tp']}p{c['pp']}{v}c{c['cp']}{e}z{c['zero']}"
    return f"{c['num_gpus']} {layout} mb{c['micro_batch_size']}{off}"
