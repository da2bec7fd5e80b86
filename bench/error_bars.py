"""Error bars from the evidence: fit the 90% intervals and check them on held-out cases.

Run: python -m bench.error_bars [--write] [--update-readme]
Prints every published case's residual log(measured / predicted), the fitted interval per stack
and regime, and the coverage of the intervals on the cases they were not fitted on (leave one
case out, and leave one source page out). --write rewrites the shipped parameters
(report/error_bars.json); --update-readme the README's error-bar block. The evidence and the
checks are tests/error_bars.py (tests/test_error_bars.py holds the shipped file and the README
to it); this is their command line.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile

from bench.accuracy import _replace_between
from tests import error_bars as eb
from tests.accuracy_table import README
from trainmem.report._error_bars import ERROR_BARS_FILE


def write_shipped() -> None:
    """report/error_bars.json from the evidence, atomically (its date today, UTC)."""
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    text = json.dumps(eb.shipped_document(fitted_on=today), indent=1) + "\n"
    fd, tmp = tempfile.mkstemp(dir=ERROR_BARS_FILE.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, ERROR_BARS_FILE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="Rewrite report/error_bars.json.")
    parser.add_argument(
        "--update-readme", action="store_true", help="Rewrite the README's error-bar block."
    )
    args = parser.parse_args()
    if args.write:
        write_shipped()
    if args.update_readme:
        _replace_between(README, eb.README_BEGIN, eb.README_END, eb.widths_markdown())
    if args.write or args.update_readme:
        return
    for r in eb.published_residuals():
        print(f"{r['stack']:<11} {r['regime']:<6} {r['residual']:+.3f}  {r['case']}")
    print()
    print(eb.widths_markdown())
    for by in ("case", "source"):
        for m in eb.held_out(by)["misses"]:
            print(
                f"  missed ({by} held out): {m['case']} r={m['residual']:+.3f} "
                f"outside [{m['low_log']:+.3f}, {m['high_log']:+.3f}]"
            )


if __name__ == "__main__":
    main()
