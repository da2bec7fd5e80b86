"""Optuna where it pays: its gap to the exact optimum, with and without warm start, on spaces
of 3 to 23 million points, against the exhaustive search of the same spaces.

Run: python -m bench.optuna [--quick] [--trials N] [--seeds K]
The jobs are 3 models (a dense 70B, two mixture-of-experts models whose expert-parallel axis
multiplies the space) x 2 sequence lengths x 2 global batches, each on one fleet of three pools
(1,024 H100, 1,024 A100, 512 H200: a job uses one pool, the search picks it) with wide axes
(micro-batch to 64, pp to 64, cp to 16). A sweep searches one job (model, sequence length,
global batch) at a time, so the benchmark loops over the 12 jobs. Per job: the exhaustive
search (the exact optimum, no Parquet), then for each seed Optuna with and without warm start
(in-memory storage, the default; points written to a temporary folder as a sweep does). The
warm start's own figures: its time (the coarse and zoomed exhaustive searches) and the gap of
its enqueued trials alone (the first batch). Then SQLite against in-memory
storage, time per trial, on the first job. Prints a table per job and per seed; the last line
is `optuna_median_gap_pct=<x>`: the median gap over every job and seed, warm start on.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from trainmem.catalog import load_model
from trainmem.hardware import load_gpus, parse_fleet
from trainmem.sweep._exhaustive import run_exhaustive
from trainmem.sweep._optuna import run_optuna
from trainmem.sweep._space import Space, coarse_space, make_space
from trainmem.sweep._study import WARM_START_TRIALS, warm_start_params

MODELS = ("llama-3.1-70b", "mixtral-8x22b", "qwen3-30b-a3b")
FLEET = "1024xh100-sxm-80gb,1024xa100-sxm-80gb,512xh200-sxm-141gb"
SEQ_LENS = (4096, 32768)
GLOBAL_BATCHES = (512, 2048)
AXES = {"max_micro_batch_size": 64, "max_pp": 64, "max_cp": 16}
TRIALS = 200
SEEDS = 5
WITHIN_PCT = 1.0
"""A run "reaches" the optimum at the first trial whose best point is within this of it."""


@dataclass(frozen=True, slots=True)
class Run:
    """One Optuna study: its job, seed, warm start, gap to the optimum, wall time."""

    job: str
    seed: int
    warm: bool
    gap_pct: float
    wall_s: float
    trials_to_within: int | None
    """Trials until its best was within WITHIN_PCT of the optimum (None: never)."""
    warm_gap_pct: float | None
    """The gap of the warm start's trials alone (None: no warm start)."""


def jobs(quick: bool) -> list[tuple[str, int, int]]:
    models = MODELS[:1] if quick else MODELS
    return [(m, s, g) for m in models for s in SEQ_LENS for g in GLOBAL_BATCHES]


def gap_pct(cost: float, best: float) -> float:
    return 100.0 * (cost / best - 1.0)


def trial_costs(folder: Path) -> pl.DataFrame:
    """Each trial's cheapest fitting cost, from the study's points."""
    return (
        pl.scan_parquet(sorted(folder.glob("part-t*.parquet")))
        .filter(pl.col("fits"))
        .group_by("trial")
        .agg(pl.col("cost_per_million_tokens").min())
        .collect()
    )


def trials_to_within(costs: pl.DataFrame, best: float) -> int | None:
    """The trials a study took to find a point within WITHIN_PCT of `best`."""
    near = costs.filter(pl.col("cost_per_million_tokens") <= best * (1 + WITHIN_PCT / 100))
    first = near["trial"].min()
    return None if first is None else int(first) + 1


def warm_gap_pct(costs: pl.DataFrame, best: float, num_warm: int) -> float | None:
    """The gap of the best of the first `num_warm` trials (the warm start's)."""
    if not num_warm:
        return None
    warm = costs.filter(pl.col("trial") < num_warm)["cost_per_million_tokens"]
    return gap_pct(float(warm.min()), best) if len(warm) else float("inf")


def optuna_run(space: Space, *, job: str, seed: int, warm: bool, trials: int, best: float) -> Run:
    with tempfile.TemporaryDirectory(prefix="trainmem-bench-optuna-") as out:
        start = time.perf_counter()
        found = run_optuna(space, out=out, study="o", trials=trials, seed=seed, warm_start=warm)
        wall = time.perf_counter() - start
        cost = found.best[0]["cost_per_million_tokens"] if found.best else float("inf")
        costs = trial_costs(Path(found.parquet))
    return Run(
        job,
        seed,
        warm,
        gap_pct(cost, best),
        wall,
        trials_to_within(costs, best),
        warm_gap_pct(costs, best, found.extra["warm_start_trials"]),
    )


def storage_per_trial_s(space: Space, *, trials: int) -> dict[str, float]:
    """Seconds per trial of one study (warm start off) on in-memory and on SQLite storage."""
    times = {}
    for name in ("in-memory", "sqlite"):
        with tempfile.TemporaryDirectory(prefix="trainmem-bench-optuna-") as out:
            url = None if name == "in-memory" else f"sqlite:///{Path(out) / 'optuna.db'}"
            start = time.perf_counter()
            run_optuna(
                space, out=out, study="s", trials=trials, seed=0, storage=url, warm_start=False
            )
            times[name] = (time.perf_counter() - start) / trials
    return times


def warm_up(space: Space) -> None:
    """One small exhaustive search and a short study, so that first-call costs (imports, the
    engine's compiled loop) are not timed."""
    run_exhaustive(coarse_space(space), out=None, study="w")
    with tempfile.TemporaryDirectory(prefix="trainmem-bench-optuna-") as out:
        run_optuna(space, out=out, study="w", trials=8, warm_start=False)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _reached(runs: list[Run]) -> str:
    got = [r.trials_to_within for r in runs if r.trials_to_within is not None]
    return f"{len(got)}/{len(runs)}, median {_median([float(g) for g in got]):.0f}"


def print_seed_table(runs: list[Run], exhaustive_s: float) -> None:
    print(
        f"\n{'seed':>4} {'warm':>5} {'median gap':>11} {'max gap':>8} {'exact':>6} "
        f"{'wall s (all jobs)':>18}  (exhaustive, all jobs: {exhaustive_s:.1f} s)"
    )
    for warm in (False, True):
        for seed in sorted({r.seed for r in runs}):
            mine = [r for r in runs if r.seed == seed and r.warm == warm]
            gaps = [r.gap_pct for r in mine]
            exact = sum(g < 1e-9 for g in gaps)
            print(
                f"{seed:>4} {'on' if warm else 'off':>5} {_median(gaps):>10.2f}% "
                f"{max(gaps):>7.2f}% {exact:>3}/{len(gaps):<2} {sum(r.wall_s for r in mine):>18.1f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="The first model's 4 jobs only.")
    parser.add_argument("--trials", type=int, default=TRIALS, help="Trials per study.")
    parser.add_argument("--seeds", type=int, default=SEEDS, help="Seeds 0..K-1.")
    args = parser.parse_args()
    gpus = load_gpus()
    fleet = parse_fleet(FLEET, gpus)
    print(f"cores available: {len(os.sched_getaffinity(0))}; {args.trials} trials per study")
    print(
        f"\n{'job':<26}{'points':>11}{'exh. s':>7}{'warm s':>7}{'warm gap':>9}"
        f"{'gap off':>8}{'gap on':>8}{'s off':>6}{'s on':>6}  within {WITHIN_PCT:g}% (off | on)"
    )
    runs: list[Run] = []
    exhaustive_total = 0.0
    first_space = None
    for model, seq_len, gbs in jobs(args.quick):
        space = make_space(
            load_model(model), fleet, gpus, seq_len=seq_len, global_batch_size=gbs, **AXES
        )
        if first_space is None:
            warm_up(space)
            first_space = space
        job = f"{model} s{seq_len} g{gbs}"
        start = time.perf_counter()
        exact = run_exhaustive(space, out=None, study="x")
        exhaustive_s = time.perf_counter() - start
        exhaustive_total += exhaustive_s
        if not exact.best:
            print(f"{job:<26} nothing fits")
            continue
        best = exact.best[0]["cost_per_million_tokens"]
        start = time.perf_counter()
        warm_start_params(space, ("cost",), study="w", num_trials=WARM_START_TRIALS)
        warm_s = time.perf_counter() - start
        mine = [
            optuna_run(space, job=job, seed=seed, warm=warm, trials=args.trials, best=best)
            for warm in (False, True)
            for seed in range(args.seeds)
        ]
        runs += mine
        off = [r for r in mine if not r.warm]
        on = [r for r in mine if r.warm]
        warm_gap = on[0].warm_gap_pct if on and on[0].warm_gap_pct is not None else float("nan")
        print(
            f"{job:<26}{space.num_points:>11,}{exhaustive_s:>7.2f}{warm_s:>7.2f}{warm_gap:>8.2f}%"
            f"{_median([r.gap_pct for r in off]):>7.2f}%{_median([r.gap_pct for r in on]):>7.2f}%"
            f"{_median([r.wall_s for r in off]):>6.2f}{_median([r.wall_s for r in on]):>6.2f}"
            f"  {_reached(off)} | {_reached(on)}"
        )
    print_seed_table(runs, exhaustive_total)
    if first_space is not None:
        per_trial = storage_per_trial_s(first_space, trials=100)
        print(
            f"\nstorage, 100 trials of the first job: in-memory "
            f"{1000 * per_trial['in-memory']:.1f} ms/trial, SQLite {1000 * per_trial['sqlite']:.1f}"
            f" ms/trial ({per_trial['sqlite'] / per_trial['in-memory']:.1f}x)"
        )
    print(f"optuna_median_gap_pct={_median([r.gap_pct for r in runs if r.warm]):.3f}")


if __name__ == "__main__":
    main()
