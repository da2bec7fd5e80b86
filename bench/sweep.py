"""Sweep benchmarks: exhaustive points per second (Parquet write included), where the time goes
(evaluation vs writing the parts), the bytes on disk, and Optuna vs exhaustive.

Run: python -m bench.sweep [--out DIR] [--quick] [--no-optuna] [--zstd-levels] [--kernels]
Prints, per case: the space size; the exhaustive wall time and points per second with its
Parquet parts, and without writing anything (evaluation only); the time the parts take to write
(one after another, as the writer thread does, then published: fsynced and linked) and their
bytes on disk; the same sweep with each partial `--store`; `--zstd-levels`: write time and bytes
of the case's parts at zstd levels 1, 3 and 6; `--kernels`: the evaluation with numpy, with the
compiled per-row loop, and with the model's per-key formulas compiled too. For Optuna: the
trials, points evaluated, wall time and the gap of its best cost to the exact optimum (an
in-memory storage).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from trainmem.catalog import load_model
from trainmem.engine._fast import _kernel
from trainmem.hardware import load_gpus, parse_fleet
from trainmem.results import _store
from trainmem.sweep._exhaustive import run_exhaustive
from trainmem.sweep._optuna import run_optuna
from trainmem.sweep._points import _frame
from trainmem.sweep._space import POINT_COLUMNS, Space, make_space

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
CHUNK_SIZE = 100_000
"""run_exhaustive's default: one part per 100,000 points."""
ZSTD_LEVELS = (1, 3, 6)
PARTIAL_STORES = ("valid", "fits", "best-per-layout")


def bytes_on_disk(folder: str | os.PathLike[str]) -> int:
    """The bytes of a study folder's parts."""
    return sum(p.stat().st_size for p in Path(folder).glob("part-*.parquet"))


def best_of(runs: int, run: Any) -> tuple[float, Any]:
    """The least wall time of `runs` calls of run() (cache and page-cache warm after the first),
    and the last call's result."""
    best, result = float("inf"), None
    for _ in range(runs):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    return best, result


def write_times(space: Space, out: str, *, level: int) -> tuple[float, float, int]:
    """Write the sweep's parts one after another at zstd `level` (each chunk evaluated first,
    untimed), then publish them: (write s, publish s, bytes on disk)."""
    folder = _store.study_dir(out, f"write-{level}")
    shutil.rmtree(folder, ignore_errors=True)
    saved, _store.ZSTD_LEVEL = _store.ZSTD_LEVEL, level
    write_s, pending = 0.0, []
    try:
        for lo in range(0, space.num_points, CHUNK_SIZE):
            chunk = range(lo, min(lo + CHUNK_SIZE, space.num_points))
            frame = _frame(space, space.evaluate(chunk, columns=POINT_COLUMNS), study="w")
            start = time.perf_counter()
            pending.append(_store.write_pending(frame, out, study=f"write-{level}", part=f"{lo}"))
            write_s += time.perf_counter() - start
    finally:
        _store.ZSTD_LEVEL = saved
    start = time.perf_counter()
    _store.publish_pending(pending)
    return write_s, time.perf_counter() - start, bytes_on_disk(folder)


def exhaustive_figures(space: Space, out: str, study: str) -> float:
    """Print the exhaustive sweep's figures; returns its best cost (per million tokens)."""
    n = space.num_points
    folder = _store.study_dir(out, study)

    def with_parts() -> Any:
        shutil.rmtree(folder, ignore_errors=True)
        return run_exhaustive(space, out=out, study=study)

    wall_s, exact = best_of(2, with_parts)
    eval_s, _ = best_of(2, lambda: run_exhaustive(space, out=None, study=study))
    write_s, publish_s, size = write_times(space, out, level=_store.ZSTD_LEVEL)
    best = exact.best[0]["cost_per_million_tokens"] if exact.best else float("nan")
    print(
        f"  exhaustive: {wall_s:.2f} s, {n / wall_s:,.0f} points/s (Parquet included), "
        f"best ${best:.4f} per million tokens"
    )
    print(
        f"  evaluation only {eval_s:.2f} s ({n / eval_s:,.0f} points/s); the "
        f"{-(-n // CHUNK_SIZE)} parts: written in {write_s:.3f} s, published (fsync, link) in "
        f"{publish_s:.3f} s; {size:,} bytes on disk ({size / n:.2f} per point)"
    )
    return best


KERNEL_MODES = (
    # (label, TRAINMEM_KERNEL, formula kernels on)
    ("numpy", "numpy", False),
    ("compiled loop, numpy formulas", "numba", False),
    ("compiled loop and formulas", "numba", True),
)


def kernel_figures(space: Space, study: str) -> None:
    """Print evaluation-only points per second with each kernel mode (best of 3, interleaved):
    numpy; the compiled per-row loop; it and the model's compiled formulas (the first run
    compiles those where they are not cached yet, outside the clock)."""
    if _kernel._compiled() is None:
        return
    saved_env, saved_keys = os.environ.get(_kernel.KERNEL_ENV), _kernel.FORMULA_LOADED_MIN_KEYS
    best = dict.fromkeys(KERNEL_MODES, float("inf"))
    try:
        for run in range(4):
            for mode in KERNEL_MODES:
                os.environ[_kernel.KERNEL_ENV] = mode[1]
                _kernel.FORMULA_LOADED_MIN_KEYS = saved_keys if mode[2] else 1 << 62
                start = time.perf_counter()
                run_exhaustive(space, out=None, study=study)
                if run:  # the first round warms (and compiles) each mode
                    best[mode] = min(best[mode], time.perf_counter() - start)
    finally:
        _kernel.FORMULA_LOADED_MIN_KEYS = saved_keys
        os.environ.pop(_kernel.KERNEL_ENV, None)
        if saved_env is not None:
            os.environ[_kernel.KERNEL_ENV] = saved_env
    base = best[KERNEL_MODES[0]]
    for mode, seconds in best.items():
        print(
            f"  evaluation only, {mode[0]}: {seconds:.2f} s, "
            f"{space.num_points / seconds:,.0f} points/s ({base / seconds:.2f}x numpy)"
        )


def store_figures(space: Space, out: str, study: str) -> None:
    """Print wall time, rows and bytes of the sweep with each partial --store."""
    for store in PARTIAL_STORES:
        name = f"{study}-{store}"
        shutil.rmtree(_store.study_dir(out, name), ignore_errors=True)
        start = time.perf_counter()
        result = run_exhaustive(space, out=out, study=name, store=store)
        wall_s = time.perf_counter() - start
        size = bytes_on_disk(_store.study_dir(out, name))
        print(
            f"  --store {store}: {wall_s:.2f} s, {result.extra['num_points_stored']:,} points "
            f"stored, {size:,} bytes"
        )


def level_figures(space: Space, out: str) -> None:
    """Print write time and bytes of the case's parts at each of ZSTD_LEVELS (best of 3)."""
    for level in ZSTD_LEVELS:
        runs = [write_times(space, out, level=level) for _ in range(3)]
        write_s, _, size = min(runs)
        print(f"  zstd level {level}: parts written in {write_s:.3f} s, {size:,} bytes")


def optuna_figures(space: Space, out: str, study: str, best: float) -> None:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=None, help="Output folder (default: a temporary one).")
    parser.add_argument("--quick", action="store_true", help="Only the first case.")
    parser.add_argument("--no-optuna", action="store_true", help="Skip the Optuna studies.")
    parser.add_argument(
        "--kernels",
        action="store_true",
        help="Evaluation with numpy, the compiled loop, and the compiled formulas too.",
    )
    parser.add_argument(
        "--zstd-levels", action="store_true", help=f"Parts written at zstd {ZSTD_LEVELS}."
    )
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="trainmem-bench-")
    gpus = load_gpus()
    jobs = len(os.sched_getaffinity(0))
    print(f"cores available: {jobs}; output {out}")
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
        print(f"\n{label}: {space.num_points:,} points")
        best = exhaustive_figures(space, out, study)
        if args.kernels:
            kernel_figures(space, study)
        store_figures(space, out, study)
        if args.zstd_levels:
            level_figures(space, out)
        if jobs > 1:
            shutil.rmtree(_store.study_dir(out, f"{study}-jobs"), ignore_errors=True)
            par = run_exhaustive(space, out=out, study=f"{study}-jobs", jobs=jobs)
            print(
                f"  exhaustive over {jobs} processes: {par.elapsed_s:.2f} s, "
                f"{space.num_points / par.elapsed_s:,.0f} points/s (process start included)"
            )
        if not args.no_optuna:
            optuna_figures(space, out, study, best)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak resident memory: {peak_mib:,.0f} MiB")


if __name__ == "__main__":
    main()
