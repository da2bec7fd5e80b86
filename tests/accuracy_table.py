"""The README's accuracy table: the estimate against the ground truth (tests/data/groundtruth).

tests/test_readme.py checks that the README shows what markdown() returns; `python -m
bench.accuracy --update-readme` writes it.
"""

from __future__ import annotations

from pathlib import Path

from tests._groundtruth import estimate_case, load_cases

README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN, END = "<!-- accuracy:begin -->", "<!-- accuracy:end -->"
"""The markers the table sits between in README.md."""


def rows() -> list[dict[str, object]]:
    """Per case: whether the states are exact, and the activations and peak relative errors."""
    out = []
    for case in load_cases():
        est = estimate_case(case)
        gt = case["bytes"]
        sharded = case["training"].get("zero") == 3
        params = est["parameters"] + (est["master_weights"] if sharded else 0.0)
        exact = (
            params == gt["parameters"]
            and est["gradients_total"] == gt["gradients"]
            and est["optimizer_states"] == gt["optimizer_states"]
        )
        out.append(
            {
                "case": case["id"],
                "per_stage": case["training"].get("pp_rank", 0) > 0,
                "states_exact": exact,
                "activations_err": est["activations_total"] / gt["activations"] - 1.0,
                "peak_err": est["peak_allocated_bytes"] / gt["peak_allocated"] - 1.0,
            }
        )
    return out


def markdown() -> str:
    """The accuracy table as Markdown (what --update-readme writes between the markers)."""
    lines = [
        "| case | params, grads, optimizer states exact | activations error "
        "| peak allocated error |",
        "|---|---|---:|---:|",
    ]
    table = rows()
    for r in table:
        note = " (non-worst pipeline stage; see per-stage view)" if r["per_stage"] else ""
        lines.append(
            f"| {r['case']}{note} | {'yes' if r['states_exact'] else 'no'} | "
            f"{r['activations_err']:+.2%} | {r['peak_err']:+.2%} |"
        )
    worst = [r for r in table if not r["per_stage"]]
    lines.append("")
    lines.append(
        f"{len(worst)} worst-rank cases: max |activations error| "
        f"{max(abs(float(r['activations_err'])) for r in worst):.2%}, max |peak allocated error| "
        f"{max(abs(float(r['peak_err'])) for r in worst):.2%}."
    )
    return "\n".join(lines)
