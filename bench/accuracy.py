"""Accuracy against the ground truth (tests/data/groundtruth) and per framework: the README's
accuracy tables.

Run: python -m bench.accuracy [--markdown] [--frameworks] [--update-readme]
Prints, per case, the estimate's relative error on activations and peak allocated bytes, and
whether parameters, gradients and optimizer states are exact; with --frameworks, the traced
steps of the frameworks' own code and their published real-GPU peaks, per framework
(tests/framework_accuracy.py). --update-readme rewrites the README's tables and the per-case
framework table of docs/accuracy.md. The tables themselves are tests/accuracy_table.py and
tests/framework_accuracy.py (the README test checks them); this is their command line.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tests import framework_accuracy
from tests.accuracy_table import BEGIN, END, README, markdown, rows

DOCS = README.parent / "docs" / "accuracy.md"
TECHNIQUES = README.parent / "docs" / "techniques.md"

__all__ = ["BEGIN", "END", "main", "markdown", "rows", "update_readme"]


def _replace_between(path: Path, begin: str, end: str, body: str) -> None:
    """Rewrite what sits between two markers of a file, atomically."""
    text = path.read_text()
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(f"{head}{begin}\n{body}\n{end}{tail}")
    tmp.replace(path)


def update_readme() -> None:
    """Rewrite the README's tables and the per-case framework table of docs/accuracy.md."""
    fa = framework_accuracy
    _replace_between(README, BEGIN, END, markdown())
    _replace_between(README, fa.README_BEGIN, fa.README_END, fa.summary_markdown())
    _replace_between(DOCS, fa.DOCS_BEGIN, fa.DOCS_END, fa.cases_markdown())
    _replace_between(TECHNIQUES, fa.MODES_BEGIN, fa.MODES_END, fa.modes_markdown())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--markdown", action="store_true", help="Print a Markdown table.")
    parser.add_argument(
        "--frameworks", action="store_true", help="The per-framework tables instead."
    )
    parser.add_argument(
        "--update-readme", action="store_true", help="Rewrite the README's accuracy tables."
    )
    args = parser.parse_args()
    if args.update_readme:
        update_readme()
        return
    if args.frameworks:
        print(framework_accuracy.summary_markdown())
        print()
        print(framework_accuracy.cases_markdown())
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
