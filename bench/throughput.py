"""Configurations estimated per second by the vectorized engine, on one core.

Run: python -m bench.throughput [--rows N] [--model NAME]
The last line printed is `configurations_per_second=<number>`.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from trainmem.catalog import load_model
from trainmem.engine import ATTENTION, OPTIMIZERS, PRECISIONS, RECOMPUTE, estimate, make_grid


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
    best = float("inf")
    out: dict = {}
    for _ in range(repeats):
        start = time.perf_counter()
        out = estimate(model, grid, usable_bytes=85e9)
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--model", default="llama-2-7b")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = load_model(args.model)
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    seconds, _ = _rate(model, random_grid(args.rows), args.repeats)
    print(
        f"random rows (every field drawn independently): rows={args.rows:,} "
        f"seconds={seconds:.3f} configurations_per_second_random={args.rows / seconds:.0f}"
    )
    seconds, out = _rate(model, sweep_grid(args.rows), args.repeats)
    print(
        f"sweep grid (Cartesian product, 64 GPUs): model={model.name} rows={args.rows:,} "
        f"best_of={args.repeats} seconds={seconds:.3f} fits={int(np.sum(out['fits'])):,}"
    )
    print(f"OMP_NUM_THREADS={threads}; numpy elementwise work runs on one core")
    print("reference: llm-analysis ~4,500/s, Calculon ~40/s on this machine (issue #2)")
    print(f"configurations_per_second={args.rows / seconds:.0f}")


if __name__ == "__main__":
    main()
