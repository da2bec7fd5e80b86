"""The bounds of a trace child (trace/_child.py): a timeout and a memory cap, from
`trainmem trace --timeout / --max-memory-gb` (or trace_report's timeout_s / max_memory_gb), else
the variables TRAINMEM_TRACE_TIMEOUT / TRAINMEM_TRACE_MAX_MEMORY_GB, else 1800 s and no cap;
each checked against BOUNDS (one ValueError line naming the flag or variable and the range),
and the error lines of a trace stopped at one of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

TIMEOUT_VARIABLE = "TRAINMEM_TRACE_TIMEOUT"
MEMORY_VARIABLE = "TRAINMEM_TRACE_MAX_MEMORY_GB"
DEFAULT_TIMEOUT_S = 1800.0
GB = 2**30
"""The memory cap's unit, as _cap_memory has always counted it (2^30 bytes)."""
BOUNDS = {TIMEOUT_VARIABLE: (0.1, 7 * 86400.0, "seconds"), MEMORY_VARIABLE: (1.0, 65536.0, "GB")}
"""Allowed values of the bound variables and flags (inclusive): a timeout of 0.1 s to a week,
a memory cap of 1 GB (torch alone maps more) to 64 TB."""
FLAGS = {TIMEOUT_VARIABLE: "--timeout", MEMORY_VARIABLE: "--max-memory-gb"}
"""The `trainmem trace` flag of each bound (the variables are its fallbacks)."""


def _in_bounds(variable: str, raw: object) -> float | None:
    """`raw` (text or a number) as a number within BOUNDS[variable], else None (nan, inf,
    1e309, abc, a bool and anything out of range)."""
    lo, hi, _ = BOUNDS[variable]
    if isinstance(raw, bool):
        return None
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if lo <= value <= hi else None  # nan fails too


def _positive_float(variable: str, default: float | None) -> float | None:
    """$variable as a number within BOUNDS, else a one-line ValueError naming it (0, -5, nan,
    inf, 1e309, abc and 0.001 GB are refused); `default` where it is unset."""
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return default
    value = _in_bounds(variable, raw)
    if value is None:
        lo, hi, unit = BOUNDS[variable]
        raise ValueError(
            f"trace: {variable} must be a number of {unit} from {lo:g} to {hi:g}; got {raw!r}"
        )
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class Bounds:
    """A trace child's limits, and how its errors name them."""

    timeout_s: float
    timeout_label: str
    """The limit as the user set it: '--timeout 20 s', 'TRAINMEM_TRACE_TIMEOUT 20 s', ..."""
    max_memory_gb: float | None
    """None: no cap."""
    memory_label: str = ""


def resolve_bounds(
    timeout_s: object = None,
    max_memory_gb: object = None,
    *,
    timeout_name: str = FLAGS[TIMEOUT_VARIABLE],
    memory_name: str = FLAGS[MEMORY_VARIABLE],
) -> Bounds:
    """The bounds of a trace child: each value given (a flag's text, or a number from Python,
    named `timeout_name` / `memory_name` in its one-line error), else its variable, else the
    default (1800 s, no memory cap)."""

    def one(variable: str, raw: object, name: str) -> tuple[float | None, str]:
        lo, hi, unit = BOUNDS[variable]
        short = "s" if unit == "seconds" else unit
        if raw is None:
            value = _positive_float(variable, None)
            return value, f"{variable} {value:g} {short}" if value is not None else ""
        value = _in_bounds(variable, raw)
        if value is None:
            raise ValueError(
                f"{name}: must be a number of {unit} from {lo:g} to {hi:g}; got {str(raw)!r}"
            )
        return value, f"{name} {value:g} {short}"

    timeout, timeout_label = one(TIMEOUT_VARIABLE, timeout_s, timeout_name)
    memory, memory_label = one(MEMORY_VARIABLE, max_memory_gb, memory_name)
    if timeout is None:
        timeout, timeout_label = DEFAULT_TIMEOUT_S, f"the default {timeout_name} {1800:g} s"
    return Bounds(
        timeout_s=timeout,
        timeout_label=timeout_label,
        max_memory_gb=memory,
        memory_label=memory_label,
    )


def timeout_line(bounds: Bounds) -> str:
    """The error of a trace stopped at its timeout."""
    return (
        f"trace exceeded {bounds.timeout_label} and was stopped with every process it started "
        f"(a model that loops? --timeout or {TIMEOUT_VARIABLE} allows more)"
    )


def memory_line(bounds: Bounds, what: str) -> str:
    """The error of a trace stopped at its memory cap (`what` says how it was seen)."""
    return (
        f"trace exceeded {bounds.memory_label}: {what}; stopped with every process it started "
        f"(--max-memory-gb or {MEMORY_VARIABLE} allows more)"
    )
