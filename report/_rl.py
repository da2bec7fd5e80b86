"""An RL job's phases in the reports: the engine's rl_phases (engine/_rl.py) over estimate()'s
columns, folded into the fit, and the JSON keys and text lines of one row."""

from __future__ import annotations

from typing import Any

import numpy as np

from trainmem.engine import GIB, ModelSpec, Overheads
from trainmem.engine._rl import RL_NONE, RL_OUTPUTS, RL_PHASES, rl_phases

from ._error_bars import error_bar_report

RL_BYTES_KEYS = tuple(
    k for k in RL_OUTPUTS if k.endswith("_bytes") and not k.startswith(("peak_", "rl_peak"))
)
"""The `rl` block's byte figures (per GPU), as rl_phases names them."""


def is_rl(grid: dict[str, np.ndarray]) -> bool:
    """Whether any row of the grid is an RL job."""
    return bool(np.any(np.asarray(grid["rl"]) != RL_NONE))


def rl_columns(
    spec: ModelSpec,
    grid: dict[str, np.ndarray],
    out: dict[str, np.ndarray],
    *,
    usable_bytes: Any,
    headroom: float,
    overheads: Overheads,
) -> dict[str, np.ndarray]:
    """rl_phases of every row on GPUs of `usable_bytes` (one number, or one per row). The
    rollout engine's gpu_memory_utilization multiplies the device's total as CUDA reports it
    (torch.cuda.mem_get_info's total: the profile's usable_bytes, not the marketed capacity;
    vllm 0.33.0 vllm/utils/mem_utils.py MemorySnapshot.total_memory); the limit is usable
    memory less the headroom."""
    total = np.asarray(usable_bytes, dtype=np.float64)
    return rl_phases(
        spec,
        grid,
        out,
        total_bytes=total,
        limit_bytes=total * (1.0 - headroom),
        cuda_context_bytes=overheads.cuda_context_bytes,
        nccl_bytes_per_communicator=overheads.nccl_bytes_per_communicator,
        cublas_workspace_bytes=overheads.cublas_workspace_bytes,
    )


def fold_rl(
    out: dict[str, np.ndarray],
    rl: dict[str, np.ndarray],
    grid: dict[str, np.ndarray],
    *,
    limit_bytes: float,
) -> dict[str, np.ndarray]:
    """estimate()'s columns with an RL row's fit judged on its three phases: `fits` also needs
    the rollout engine to start and every phase under the limit; `headroom_bytes` is the
    margin of the largest phase. Rows with rl none unchanged."""
    rows = np.asarray(grid["rl"]) != RL_NONE
    folded = dict(out)
    if "fits" in out:
        folded["fits"] = np.where(rows, out["fits"] & rl["rl_fits"], out["fits"])
    if "headroom_bytes" in out:
        margin = limit_bytes - np.nan_to_num(rl["rl_peak_bytes"], nan=0.0)
        folded["headroom_bytes"] = np.where(
            rows, np.minimum(out["headroom_bytes"], margin), out["headroom_bytes"]
        )
    return folded


def rl_top_consumers(report: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The top consumers of an RL report whose peak is its rollout (what the GPU holds then,
    largest first: the step's consumers are not what the rollout holds); None otherwise."""
    block = report.get("rl")
    if not block or block["peak_phase"] != "rollout":
        return None
    return _rollout_consumers(block)


def _rollout_consumers(block: dict[str, Any]) -> list[dict[str, Any]]:
    """What the GPU holds at a rollout peak, largest first."""
    parts = [
        ("the rollout engine's budget (gpu_memory_utilization x total: weights, KV cache, "
         "activations)", block["rollout_budget_bytes"]),
        ("the trainer's states left on the GPU while it generates",
         block["trainer_resident_bytes"]),
        ("the reference model", block["reference_bytes"]),
        ("the critic's states", block["critic_resident_bytes"]),
        ("the engine's context and CUDA graphs, outside its budget",
         block["rollout_outside_budget_bytes"]),
    ]  # fmt: skip
    kept = [{"what": w, "bytes": int(b)} for w, b in parts if b]
    return sorted(kept, key=lambda c: -c["bytes"])


def _number(x: Any) -> float | None:
    """The first value of `x` as a float, None where it is not finite."""
    value = float(np.asarray(x).reshape(-1)[0])
    return value if np.isfinite(value) else None


def _int(x: Any) -> int | None:
    value = _number(x)
    return None if value is None else int(round(value))


def rl_report(
    report: dict[str, Any], rl: dict[str, np.ndarray], *, config: dict[str, Any], row: int = 0
) -> dict[str, Any]:
    """The report of an RL row: `phases` gains rollout / score / train (device bytes: the
    rollout engine's budget is a share of device memory; score only where a log-prob forward
    runs, rollout only where the job generates), the peak and its phase over them,
    `advised_rollout_gpu_memory_utilization` (null: none fits) and the `rl` block."""
    at = {k: np.asarray(v)[row : row + 1] for k, v in rl.items()}
    phases = dict(report["phases"])
    for name in RL_PHASES:
        value = _int(at[f"peak_{name}_bytes"])
        if value is not None:
            phases[name] = value
    peak = _int(at["rl_peak_bytes"])
    limit = report["gpu"]["usable_bytes"] * (1.0 - report["headroom"])
    fits = bool(report["fits"] and at["rl_fits"][0])
    block = {
        "algorithm": config["rl"],
        "phases": {k: phases[k] for k in RL_PHASES if k in phases},
        "peak_device_bytes": peak,
        "peak_phase": RL_PHASES[int(at["rl_peak_phase"][0])],
        "step_peak_device_bytes": report["peak_device_bytes"],
        "step_peak_phase": report["peak_phase"],
        **{k: _int(at[k]) for k in RL_BYTES_KEYS},
        "rollout_sequences": _int(at["rollout_sequences"]),
        "rollout_starts": bool(at["rollout_starts"][0]),
        "kv_cache_short": bool(at["kv_cache_available_bytes"][0] < at["kv_cache_needed_bytes"][0]),
        "max_rollout_gpu_memory_utilization": _number(at["max_rollout_gpu_memory_utilization"]),
        "advised_rounding": (
            "the smallest multiple of 0.05 that holds the rollout's sequences without "
            "preemption, at most max_rollout_gpu_memory_utilization (the largest multiple of "
            "0.05 that fits)"
        ),
    }
    # The error bars of the RL peak: the trainer's share is a prediction, the rollout engine's
    # budget a reservation (vLLM takes util x total whatever the model needs).
    fixed = block["rollout_budget_bytes"] if block["peak_phase"] == "rollout" else 0
    bars = error_bar_report(peak or 0, limit, config, fixed_bytes=fixed or 0)
    return {
        **report,
        **bars,
        "phases": phases,
        "peak_device_bytes": peak,
        "peak_phase": block["peak_phase"],
        "fits": fits,
        "headroom_bytes": int(round(min(report["headroom_bytes"], limit - (peak or 0)))),
        "advised_rollout_gpu_memory_utilization": _number(
            at["advised_rollout_gpu_memory_utilization"]
        ),
        "rl": block,
    }


def rl_lines(report: dict[str, Any]) -> list[str]:
    """The text of an RL row: the per-phase table, the KV cache, the advised utilization."""
    block = report.get("rl")
    if not block:
        return []
    c = report["config"]
    resident = (
        block["reference_bytes"]
        + block["critic_resident_bytes"]
        + block["rollout_sleep_residual_bytes"]
    )
    what = {
        "rollout": (
            f"trainer states {_gib(block['trainer_resident_bytes'])} + engine budget "
            f"{_gib(block['rollout_budget_bytes'])} (util {c['rollout_gpu_memory_utilization']})"
        ),
        "score": f"logits {_gib(block['score_logits_bytes'])} + resident states",
        "train": (
            f"trainer step {_gib(block['step_peak_device_bytes'])} + resident {_gib(resident)}"
        ),
    }
    lines = ["", f"  RL {block['algorithm']} phases (device, GiB)   dominated by"]
    for name, value in block["phases"].items():
        lines.append(f"  {name:<10}{value / GIB:>10.2f}       {what[name]}")
    lines.append(f"  -> peak in {block['peak_phase']}")
    if "rollout" in block["phases"]:
        short = " (short: the engine preempts and recomputes)" if block["kv_cache_short"] else ""
        lines.append(
            f"  KV cache: {_gib(block['kv_cache_available_bytes'])} available, "
            f"{_gib(block['kv_cache_needed_bytes'])} needed for {block['rollout_sequences']} "
            f"sequences of {c['seq_len']} tokens{short}"
        )
        if not block["rollout_starts"]:
            lines.append(
                "  the rollout engine does not start: free memory below util x total, or no "
                "room for one max-length sequence"
            )
        advised = report["advised_rollout_gpu_memory_utilization"]
        largest = block["max_rollout_gpu_memory_utilization"]
        lines.append(
            "  advised rollout gpu_memory_utilization: "
            + (
                f"{advised:.2f} (holds its {block['rollout_sequences']} sequences without "
                f"preemption; at most {largest:.2f} fits beside the trainer)"
                if advised is not None and largest is not None
                else "none fits"
            )
        )
    return lines


def _gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / GIB:.2f} GiB"
