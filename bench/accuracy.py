"""Accuracy against the ground truth (tests/data/groundtruth): the README's accuracy table.

Run: python -m bench.accuracy [--markdown]
Prints, per case, the estimate's relative error on activations and peak allocated bytes, and
whether parameters, gradients and optimizer states are exact.
"""

from __future__ import annotations

import argparse

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--markdown", action="store_true", help="Print a Markdown table.")
    args = parser.parse_args()
    table = rows()
    worst_rank = [r for r in table if not r["per_stage"]]
    if args.markdown:
        print("| case | states exact | activations error | peak allocated error |")
        print("|---|---|---:|---:|")
    for r in table:
        note = " (non-worst pipeline stage: not estimated)" if r["per_stage"] else ""
        if args.markdown:
            print(
                f"| {r['case']}{note} | {'yes' if r['states_exact'] else 'no'} | "
                f"{r['activations_err']:+.2%} | {r['peak_err']:+.2%} |"
            )
        else:
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
