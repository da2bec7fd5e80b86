"""`trainmem compare`: two configurations' estimates side by side and their differences.

The work is two `estimate_report` calls; what is added is the difference of every component at
the peak and of every phase peak (second less first), and the configuration fields that
differ. Bad input raises ValueError (one line naming the field), as estimate does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainmem.engine import COMPONENTS, GIB, PHASES

from ._estimate import estimate_report

TOTALS = ("peak_allocated_bytes", "peak_reserved_bytes", "peak_device_bytes", "headroom_bytes")
"""The report's whole-step byte figures the comparison subtracts."""

SIDES = ("a", "b")


def _changed(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The configuration fields (and model, GPU) whose values differ: name -> [a, b]."""
    out: dict[str, list[Any]] = {}
    if a["model"] != b["model"]:
        out["model"] = [a["model"], b["model"]]
    if a["gpu"]["name"] != b["gpu"]["name"]:
        out["gpu"] = [a["gpu"]["name"], b["gpu"]["name"]]
    for k, v in a["config"].items():
        if b["config"].get(k) != v:
            out[k] = [v, b["config"].get(k)]
    return out


def compare_report(
    first: tuple[Mapping[str, Any], Mapping[str, Any]],
    second: tuple[Mapping[str, Any], Mapping[str, Any]],
) -> dict[str, Any]:
    """`trainmem compare --json`: `a` and `b` (each `estimate --json` of one (training fields,
    estimate options) pair), `changed` (the fields that differ, [a, b]) and `difference` (b
    less a: the breakdown at the peak, the phase peaks, the step's totals, the step time)."""
    a = estimate_report(first[0], **first[1])
    b = estimate_report(second[0], **second[1])
    difference = {
        "breakdown_at_peak": {
            k: b["breakdown_at_peak"][k] - a["breakdown_at_peak"][k] for k in COMPONENTS
        },
        "phases": {k: b["phases"][k] - a["phases"][k] for k in PHASES},
        **{k: b[k] - a[k] for k in TOTALS},
        "step_time_s": b["time"]["step_time_s"] - a["time"]["step_time_s"],
    }
    return {"a": a, "b": b, "changed": _changed(a, b), "difference": difference}


def _gib(value: float) -> str:
    return f"{value / GIB:,.2f}"


def _rows(result: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """(name, a, b, b - a) of each line of the table."""
    a, b, d = result["a"], result["b"], result["difference"]
    rows = [
        (
            k.replace("_", " "),
            *(_gib(r["breakdown_at_peak"][k]) for r in (a, b)),
            _signed(d["breakdown_at_peak"][k]),
        )
        for k in COMPONENTS
    ]
    rows += [
        (
            f"peak {k.replace('_', ' ')}",
            _gib(a["phases"][k]),
            _gib(b["phases"][k]),
            _signed(d["phases"][k]),
        )
        for k in PHASES
    ]
    rows += [
        (k.removesuffix("_bytes").replace("_", " "), _gib(a[k]), _gib(b[k]), _signed(d[k]))
        for k in TOTALS
    ]
    rows.append(("peak phase", a["peak_phase"], b["peak_phase"], ""))
    rows.append(("fits", *("yes" if r["fits"] else "no" for r in (a, b)), ""))
    step = [r["time"]["step_time_s"] for r in (a, b)]
    rows.append(("step time (s)", f"{step[0]:.3g}", f"{step[1]:.3g}", f"{step[1] - step[0]:+.3g}"))
    return rows


def _signed(value: float) -> str:
    return f"{value / GIB:+,.2f}"


def compare_table(result: Mapping[str, Any]) -> str:
    """The human output of `trainmem compare`: what each side is, then one line per component,
    phase peak and total (GiB = 2**30 bytes, per device, worst rank)."""
    a = result["a"]
    changes = ", ".join(f"{k} {v[0]} -> {v[1]}" for k, v in result["changed"].items())
    lines = [
        f"a: {a['model']} on {a['config']['num_gpus']} x {a['gpu']['name']}",
        f"b: {changes or 'the same configuration'}",
        f"{'GiB per device':<22}{'a':>16}{'b':>16}{'b - a':>12}",
    ]
    lines += [f"{n:<22}{x:>16}{y:>16}{z:>12}".rstrip() for n, x, y, z in _rows(result)]
    return "\n".join(lines)
