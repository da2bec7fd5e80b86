"""Accuracy against the ground truth (tests/data/groundtruth): the README's accuracy table.

Run: python -m bench.accuracy [--markdown]
Prints, per case, the estimate's relative error on activations and peak allocated bytes, and
whether parameters, gradients and optimizer states are exact.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ._groundtruth import estimate_case, load_cases


def rows() -> list[dict[str, object]]:
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


README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN, END = "<!-- accuracy:begin -->", "<!-- accuracy:end -->"


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


def update_readme() -> None:
    text = README.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    tmp = README.with_suffix(".md.tmp")
    tmp.write_text(f"{head}{BEGIN}\n{markdown()}\n{END}{tail}")
    tmp.replace(README)  # atomic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--markdown", action="store_true", help="Print a Markdown table.")
    parser.add_argument(
        "--update-readme", action="store_true", help="Rewrite the README's accuracy table."
    )
    args = parser.parse_args()
    if args.update_readme:
        update_readme()
        return
    if args.markdown:
        print(markdown())
        return
    table = rows()
    worst_rank = [r for r in table if not r["per_stage"]]
    for r in table:
        note = " (non-worst pipeline stage)" if r["per_stage"] else ""
        print(
            f"{r['case']:<48} states_exact={r['states_exact']!s:<5} "
            f"activations={r['activations_err']:+.3%} peak={r['peak_err']:+.3%}{note}"
        )
    max_act = max(abs(float(r["activations_err"])) for r in worst_rank)
    max_peak = max(abs(float(r["peak_err"])) for r in worst_rank)
    exact = sum(bool(r["states_exact"]) for r in table)
    print(
        f"\ncases={len(worst_rank)} (worst-rank) states_exact={exact}/{len(table)} "
        f"max_abs_activations_error={max_act:.3%} max_abs_peak_allocated_error={max_peak:.3%}"
    )


if __name__ == "__main__":
    main()
