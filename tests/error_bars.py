"""The evidence behind the error bars (report/_error_bars.py): residuals and held-out coverage.

Published (tests/data/published/framework_cases.json, modelled cases with a measured figure):
r = log(measured / predicted) in the source's metric (framework_accuracy.measured_rows, the
README's framework table), per stack and regime; these fit the run-time intervals, which answer
for a real GPU. Traced (tests/data/framework_traces, framework_accuracy.traced_rows): the allocated
peak's r against the frameworks' own code on the fake device, about 1%: kept apart (a traced
case says nothing of the allocator, the CUDA context or a real run's settings) and used only as
the interval's narrowest width.

`python -m bench.error_bars` prints this; tests/test_error_bars.py checks the shipped file and
the README against it.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import numpy as np

from tests import framework_accuracy as fa

COMMAND = "python -m bench.error_bars --write"
README_BEGIN, README_END = "<!-- error-bars:begin -->", "<!-- error-bars:end -->"


def case_regime(flags: dict[str, Any]) -> str:
    """A published case's regime (REGIMES) from its flags."""
    if flags.get("qlora"):
        return "qlora"
    return "lora" if int(flags.get("lora_rank", 0)) > 0 else "full"


@functools.cache
def published_residuals() -> tuple[dict[str, Any], ...]:
    """Every modelled published case with a measured figure: its residual, stack, regime and
    source (the page its figure was read from: the unit of leave-one-source-out)."""
    folder = fa.DATA / "published"
    cases = {c["id"]: c for c in json.loads((folder / "framework_cases.json").read_text())["cases"]}
    records = json.loads((folder / "framework_measurements.json").read_text())
    out = []
    for r in fa.measured_rows():
        if r["measured_gib"] is None or not r["modelled"]:
            continue
        case = cases[r["case"]]
        out.append(
            {
                "case": r["case"],
                "stack": r["framework"],
                "regime": case_regime(case["flags"]),
                "metric": r["metric"],
                "source": records[case["record"]]["source"].split(" ")[0],
                "residual": round(math.log(r["measured_gib"] / r["predicted_gib"]), 6),
            }
        )
    return tuple(out)


@functools.cache
def traced_residuals() -> tuple[dict[str, Any], ...]:
    """Every traced framework case: the allocated peak's residual log(traced / predicted)."""
    return tuple(
        {
            "case": r["case"],
            "stack": r["framework"],
            "residual": round(-math.log1p(r["peak_err"]), 6),
        }
        for r in fa.traced_rows()
    )


def fit(published: Any = None) -> dict[str, Any]:
    """The interval parameters from the published residuals (all, or those given)."""
    from trainmem.report._error_bars import fit_error_bars

    rows = published_residuals() if published is None else published
    return fit_error_bars(rows, [r["residual"] for r in traced_residuals()])


def shipped_document(*, fitted_on: str) -> dict[str, Any]:
    """What report/error_bars.json holds: the parameters, the cases and their residuals, the
    traced evidence per stack (for the record) and how to regenerate it."""
    traced = traced_residuals()
    per_stack = {}
    for stack in sorted({r["stack"] for r in traced}):
        x = np.array([r["residual"] for r in traced if r["stack"] == stack])
        per_stack[stack] = {
            "num_cases": len(x),
            "q05_log": round(float(np.quantile(x, 0.05)), 6),
            "q95_log": round(float(np.quantile(x, 0.95)), 6),
        }
    return {
        "about": (
            "90% intervals of the device peak: r = log(measured / predicted) of the published "
            "real-GPU cases, normal per stack and regime, shrunk toward the stack's and the "
            "pooled fit (report/_error_bars.py fit_error_bars); sigma_log is predictive and at "
            "least sigma_floor_log (the traced cases' 90% range). Not typed: regenerate with "
            f"`{COMMAND}`; tests/test_error_bars.py fails when it is stale."
        ),
        "command": COMMAND,
        "fitted_on": fitted_on,
        **fit(),
        "published_cases": list(published_residuals()),
        "traced": per_stack,
    }


def comparable(doc: dict[str, Any]) -> dict[str, Any]:
    """The document without its date (what a staleness check compares)."""
    return {k: v for k, v in doc.items() if k != "fitted_on"}


def held_out(by: str = "case") -> dict[str, Any]:
    """Coverage of the 90% intervals on cases they were not fitted on: for each published
    case, the parameters fitted without it (by="case": leave one case out; by="source": without
    every case of its source page) and whether its residual falls inside."""
    from trainmem.report._error_bars import Z90

    rows = published_residuals()
    hits, misses, widths = 0, [], []
    for r in rows:
        train = [q for q in rows if q[by] != r[by]]
        group = fit(train)["groups"][f"{r['stack']}/{r['regime']}"]
        low = group["mean_log"] - Z90 * group["sigma_log"]
        high = group["mean_log"] + Z90 * group["sigma_log"]
        widths.append(high - low)
        if low <= r["residual"] <= high:
            hits += 1
        else:
            misses.append({**r, "low_log": round(low, 4), "high_log": round(high, 4)})
    return {
        "by": by,
        "num_cases": len(rows),
        "covered": hits,
        "coverage": hits / len(rows),
        "misses": misses,
        "median_width_log": float(np.median(widths)),
    }


@functools.cache
def outcome_scores() -> dict[str, Any]:
    """fit_probability on the published cases that say only whether the job ran or went out of
    memory (metric `fit`: no figure, so in no fit), with no headroom as their fit calls: the
    mean probability of the runs and of the OOMs, and the Brier score, mean (p - ran)^2,
    against the yes/no `fits` call's."""
    from trainmem import estimate

    cases = json.loads((fa.DATA / "published" / "framework_cases.json").read_text())["cases"]
    ran, prob, call = [], [], []
    for c in (c for c in cases if c["metric"] == "fit" and c["modelled"]):
        report = estimate(gpu=c["gpu"], headroom=0.0, **fa._resolved(c["flags"]))
        ran.append(1.0 if c.get("outcome", "ran") == "ran" else 0.0)
        prob.append(report["fit_probability"])
        call.append(1.0 if report["fits"] else 0.0)
    y, p, f = np.array(ran), np.array(prob), np.array(call)
    return {
        "num_ran": int(y.sum()),
        "num_oom": int(len(y) - y.sum()),
        "mean_probability_ran": float(p[y == 1].mean()),
        "mean_probability_oom": float(p[y == 0].mean()),
        "brier": float(np.mean((p - y) ** 2)),
        "brier_fits_call": float(np.mean((f - y) ** 2)),
    }


def widths_markdown() -> str:
    """Per stack and regime with published cases: the cases, the fitted interval (as factors of
    the prediction) and its width; then the held-out coverage."""
    doc = fit()
    lines = [
        "| stack / regime | published cases | 90% interval (x predicted) "
        "| width (high / low - 1) | from |",
        "|---|---:|---:|---:|---|",
    ]
    from trainmem.report._error_bars import Z90

    for key, g in doc["groups"].items():
        if not g["num_stack_cases"]:
            continue
        low = math.exp(g["mean_log"] - Z90 * g["sigma_log"])
        high = math.exp(g["mean_log"] + Z90 * g["sigma_log"])
        lines.append(
            f"| {key} | {g['num_cases']} | {low:.2f}-{high:.2f} | {high / low - 1:.0%} "
            f"| {g['level']} |"
        )
    p = doc["pooled"]
    low = math.exp(p["mean_log"] - Z90 * p["sigma_log"])
    high = math.exp(p["mean_log"] + Z90 * p["sigma_log"])
    lines.append(
        f"| any other (pooled) | {p['num_cases']} | {low:.2f}-{high:.2f} | {high / low - 1:.0%} "
        "| pooled |"
    )
    lines.append("")
    for by, words in (("case", "leave one case out"), ("source", "leave one source page out")):
        h = held_out(by)
        lines.append(
            f"Held out ({words}): the 90% intervals cover {h['covered']} of {h['num_cases']} "
            f"published cases ({h['coverage']:.1%})."
        )
        lines.append("")
    o = outcome_scores()
    lines.append(
        f"fit_probability on the {o['num_ran'] + o['num_oom']} published outcomes without a "
        f"figure (ran or out of memory, in no fit; no headroom): {o['mean_probability_ran']:.2f} "
        f"on average for the {o['num_ran']} that ran, {o['mean_probability_oom']:.2f} for the "
        f"{o['num_oom']} that ran out of memory; Brier score {o['brier']:.3f} (the yes/no `fits` "
        f"call's: {o['brier_fits_call']:.3f})."
    )
    return "\n".join(lines)
