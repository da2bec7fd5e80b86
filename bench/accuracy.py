"""Accuracy against the ground truth (tests/data/groundtruth): the README's accuracy table.

Run: python -m bench.accuracy [--markdown] [--update-readme]
Prints, per case, the estimate's relative error on activations and peak allocated bytes, and
whether parameters, gradients and optimizer states are exact. The table itself is
tests/accuracy_table.py (the README test checks it); this is its command line.
"""

from __future__ import annotations

import argparse

from tests.accuracy_table import BEGIN, END, README, markdown, rows

__all__ = ["BEGIN", "END", "main", "markdown", "rows", "update_readme"]


def update_readme() -> None:
    """Rewrite the table between the README's markers."""
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
