"""Configurations estimated per second by the engine: numpy's per-row assembly and the compiled
loop (engine/_fast/_kernel.py), on one thread and on every core, in the same run.

Run: python -m bench.throughput [--rows N] [--model NAME]
Both kernels return the same bits (tests/unit/engine/test_kernel.py,
tests/unit/engine/test_formula_kernels.py); the compiled loop and the model's generated
formula kernels are loaded and compiled before the clock starts (about 0.3-0.7 s once per
process; the first run compiles them, about 3 s for the loop and 20-45 s for a model's
formulas, and caches the machine code).
The last line printed is `configurations_per_second=<number>` (the sweep grid, the faster
kernel, every core).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from trainmem.catalog import load_model
from trainmem.engine import (
    ATTENTION,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    estimate,
    make_grid,
)
from trainmem.engine._fast import _kernel


def random_grid(num_rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A grid of `num_rows` varied configurations (all layouts valid for a 32-layer model)."""
    rng = np.random.default_rng(seed)
    tp = rng.choice([1, 2, 4, 8], num_rows)
    pp = rng.choice([1, 2, 4], num_rows)
    dp = rng.choice([1, 2, 4, 8], num_rows)
    return make_grid(
        micro_batch_size=rng.integers(1, 17, num_rows),
        seq_len=rng.choice([1024, 2048, 4096, 8192], num_rows),
        num_gpus=tp * pp * dp,
        tp=tp,
        pp=pp,
        zero=rng.integers(0, 4, num_rows),
        sequence_parallel=rng.random(num_rows) < 0.5,
        precision=rng.integers(0, len(PRECISIONS), num_rows),
        optimizer=rng.integers(0, len(OPTIMIZERS), num_rows),
        recompute=rng.integers(0, len(RECOMPUTE), num_rows),
        attention=rng.integers(0, len(ATTENTION), num_rows),
        framework=rng.integers(0, 4, num_rows),
    )


def sweep_grid(num_rows: int) -> dict[str, np.ndarray]:
    """A sweep-shaped grid: the Cartesian product of the knobs `trainmem sweep` explores
    (micro-batch innermost, as an exhaustive search enumerates them), cut to `num_rows`."""
    axes = {
        "micro_batch_size": np.arange(1, 65),
        "seq_len": np.array([1024, 2048, 4096, 8192]),
        "tp": np.array([1, 2, 4, 8]),
        "pp": np.array([1, 2, 4]),
        "zero": np.arange(4),
        "recompute": np.arange(len(RECOMPUTE)),
        "precision": np.array([1, 3, 5]),
        "optimizer": np.array([0, 1, 2]),
        "attention": np.arange(len(ATTENTION)),
    }
    mesh = np.meshgrid(*axes.values(), indexing="ij")
    cols = {k: v.ravel()[:num_rows] for k, v in zip(axes, mesh, strict=True)}
    reps = -(-num_rows // len(cols["tp"]))
    cols = {k: np.tile(v, reps)[:num_rows] for k, v in cols.items()}
    return make_grid(cols, num_gpus=64)


def _rate(model, grid, repeats: int) -> tuple[float, dict]:
    estimate(model, make_grid(micro_batch_size=[1, 2]))  # warm caches
    estimate(model, grid, usable_bytes=85e9)  # warm: the compiled loop's first call
    best = float("inf")
    out: dict = {}
    for _ in range(repeats):
        start = time.perf_counter()
        out = estimate(model, grid, usable_bytes=85e9)
        best = min(best, time.perf_counter() - start)
    return best, out


def _kernels() -> list[tuple[str, str, int | None, bool]]:
    """(label, TRAINMEM_KERNEL, threads, compiled formulas) to measure: numpy; the compiled
    loop with numpy's per-key formulas on one thread; with the formulas compiled too
    (engine/_fast/_formula_kernels.py) on one thread and on every core, where numba imports."""
    runs: list[tuple[str, str, int | None, bool]] = [("numpy", "numpy", None, False)]
    if _kernel._compiled() is not None:
        cores = len(os.sched_getaffinity(0))
        runs.append(("compiled loop, numpy formulas, 1 thread", "numba", 1, False))
        runs.append(("compiled, 1 thread", "numba", 1, True))
        if cores > 1:
            runs.append((f"compiled, {cores} threads", "numba", cores, True))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--model", default="llama-2-7b")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = load_model(args.model)
    grids = {"random rows (every field drawn)": random_grid(args.rows)}
    grids["sweep grid (Cartesian product, 64 GPUs)"] = sweep_grid(args.rows)
    print(f"model={model.name} rows={args.rows:,} best_of={args.repeats}")
    rates: dict[tuple[str, str], float] = {}
    min_keys = _kernel.FORMULA_MIN_KEYS, _kernel.FORMULA_LOADED_MIN_KEYS
    for label, kernel, threads, formulas in _kernels():
        os.environ[_kernel.KERNEL_ENV] = kernel
        _kernel.FORMULA_MIN_KEYS, _kernel.FORMULA_LOADED_MIN_KEYS = (
            min_keys if formulas else (1 << 62, 1 << 62)
        )
        if threads is None:
            os.environ.pop(_kernel.THREADS_ENV, None)
        else:
            os.environ[_kernel.THREADS_ENV] = str(threads)
        for name, grid in grids.items():
            seconds, out = _rate(model, grid, args.repeats)
            rates[label, name] = args.rows / seconds
            print(
                f"{label:<40} {name:<42} {seconds:.3f} s  {args.rows / seconds:>12,.0f} rows/s"
                f"  fits={int(np.sum(out['fits'])):,}"
            )
    if _kernel.formula_fallbacks:
        print("formulas left to numpy:", "; ".join(_kernel.formula_fallbacks))
    base = {name: rates["numpy", name] for name in grids}
    for (label, name), rate in rates.items():
        if label != "numpy":
            print(f"ratio {label} / numpy, {name}: {rate / base[name]:.2f}x")
    print("reference: llm-analysis 0.2.2 ~7,300/s, Calculon ~100/s on this machine (issue 17)")
    sweep_name = list(grids)[1]
    print(
        f"configurations_per_second={max(r for (_, n), r in rates.items() if n == sweep_name):.0f}"
    )


if __name__ == "__main__":
    main()
