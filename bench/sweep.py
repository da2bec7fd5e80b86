"""Sweep benchmarks: exhaustive points per second (Parquet write included), Optuna vs exhaustive.

Run: python -m bench.sweep [--out DIR] [--quick]
Prints, per case, the space size, the exhaustive wall time and points per second, and for Optuna
the trials, points evaluated, wall time and the gap of its best cost to the exact optimum.
Optuna uses an in-memory storage here (the SQLite default adds ~0.1 s per trial).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time

from trainmem.catalog import load_model
from trainmem.hardware import load_gpus, parse_fleet
from trainmem.sweep._search import run_exhaustive, run_optuna
from trainmem.sweep._space import make_space

CASES = (
    # (label, model, fleet, seq_len, global batch, space options)
    ("70B on 64 x H100 (the issue's job)", "llama-3.1-70b", "64xh100-sxm-80gb", 4096, 512, {}),
    (
        "70B on three pools, wide axes (>= 1M points)",
        "llama-3.1-70b",
        "64xh100-sxm-80gb,64xa100-sxm-80gb,32xh200-sxm-141gb",
        4096,
        512,
        {"max_micro_batch_size": 64, "max_pp": 20},
    ),
    (
        "405B on 16,384 x H100",
        "llama-3.1-405b",
        "16384xh100-sxm-80gb",
        8192,
        2048,
        {"max_micro_batch_size": 16, "max_pp": 64, "max_cp": 16},
    ),
)
OPTUNA_TRIALS = 300


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=None, help="Output folder (default: a temporary one).")
    parser.add_argument("--quick", action="store_true", help="Only the first case.")
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="trainmem-bench-")
    gpus = load_gpus()
    print(f"cores available: {len(os.sched_getaffinity(0))}; output {out}")
    for label, model, fleet, seq_len, gbs, options in CASES[:1] if args.quick else CASES:
        space = make_space(
            load_model(model),
            parse_fleet(fleet, gpus),
            gpus,
            seq_len=seq_len,
            global_batch_size=gbs,
            **options,
        )
        study = f"bench-{model}-{space.num_points}"
        shutil.rmtree(os.path.join(out, "points", f"study={study}"), ignore_errors=True)
        exact = run_exhaustive(space, out=out, study=study)
        best = exact.best[0]["cost_per_million_tokens"] if exact.best else float("nan")
        print(f"\n{label}: {space.num_points:,} points")
        print(
            f"  exhaustive: {exact.elapsed_s:.2f} s, "
            f"{space.num_points / exact.elapsed_s:,.0f} points/s (Parquet included), "
            f"best ${best:.4f} per million tokens"
        )
        jobs = len(os.sched_getaffinity(0))
        if jobs > 1:
            shutil.rmtree(os.path.join(out, "points", f"study={study}-jobs"), ignore_errors=True)
            par = run_exhaustive(space, out=out, study=f"{study}-jobs", jobs=jobs)
            print(
                f"  exhaustive over {jobs} processes: {par.elapsed_s:.2f} s, "
                f"{space.num_points / par.elapsed_s:,.0f} points/s (process start included)"
            )
        for seed in (0, 1, 2):
            start = time.perf_counter()
            found = run_optuna(
                space,
                out=out,
                study=f"{study}-optuna-{seed}",
                trials=OPTUNA_TRIALS,
                seed=seed,
                storage=":memory:",
            )
            wall = time.perf_counter() - start
            cost = found.best[0]["cost_per_million_tokens"] if found.best else float("nan")
            print(
                f"  optuna seed {seed}: {OPTUNA_TRIALS} trials ({found.num_points:,} points) "
                f"in {wall:.1f} s, best ${cost:.4f}: gap {100 * (cost / best - 1):+.2f}%"
            )
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak resident memory: {peak_mib:,.0f} MiB")


if __name__ == "__main__":
    main()
