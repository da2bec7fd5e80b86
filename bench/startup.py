"""Start-up time of the command line: `trainmem estimate` and `trainmem --help`, wall clock of a
fresh process each, and what the estimate path spends importing (`python -X importtime`).

Run: python -m bench.startup [--repeats N] [--model NAME]
The last line printed is `estimate_wall_s=<number>` (best of the repeats).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def trainmem_command() -> list[str]:
    """The `trainmem` console script next to this interpreter, else `python -m trainmem.cli`."""
    script = Path(sys.executable).with_name("trainmem")
    if script.exists():
        return [str(script)]
    found = shutil.which("trainmem")
    return [found] if found else [sys.executable, "-m", "trainmem.cli"]


def best_wall_s(argv: list[str], *, repeats: int, cwd: str) -> float:
    """The smallest wall-clock time of `repeats` runs of `argv` (output discarded)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, check=True)
        best = min(best, time.perf_counter() - start)
    return best


def import_times(code: str, *, cwd: str) -> list[tuple[int, int, str]]:
    """(self_us, cumulative_us, module) for every module `python -X importtime -c code` loads."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=True,
    )
    rows = []
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cumulative_us, name = line.removeprefix("import time:").split("|")
        rows.append((int(self_us), int(cumulative_us), name.strip()))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--model", default="llama-2-7b")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    command = trainmem_command()
    estimate = [*command, "estimate", "--model", args.model]
    # Outside the repository: its folders must not shadow the installed package.
    with tempfile.TemporaryDirectory() as cwd:
        estimate_s = best_wall_s(estimate, repeats=args.repeats, cwd=cwd)
        help_s = best_wall_s([*command, "--help"], repeats=args.repeats, cwd=cwd)
        code = f"from trainmem.cli import main; main(['estimate', '--model', {args.model!r}])"
        rows = import_times(code, cwd=cwd)
    print(f"command: {' '.join(estimate)}")
    print(f"trainmem estimate --model {args.model}: {estimate_s:.3f} s (best of {args.repeats})")
    print(f"trainmem --help: {help_s:.3f} s (best of {args.repeats})")
    total_ms = sum(r[0] for r in rows) / 1e3
    print(f"imports of the estimate path: {len(rows)} modules, {total_ms:.1f} ms (sum of self)")
    for title, key in (("self", 0), ("cumulative", 1)):
        print(f"top {args.top} by {title} import time (ms):")
        for row in sorted(rows, key=lambda r: r[key], reverse=True)[: args.top]:
            print(f"  {row[0] / 1e3:8.1f} self {row[1] / 1e3:8.1f} cumulative  {row[2]}")
    print(f"estimate_wall_s={estimate_s:.3f}")


if __name__ == "__main__":
    main()
