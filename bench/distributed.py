"""An exhaustive sweep of ~20 million points run locally (`--jobs 2`) and on a Dask LocalCluster
(`--scheduler`, 4 worker processes): wall times, and whether both wrote the same points.

Run: python -m bench.distributed [--out DIR] [--workers 4] [--jobs 2] [--memory-limit 2GiB]
Prints the space size; the local run's wall time; the cluster's start-up time, its run's wall
time and a rerun's (every part skipped); then the check: the same part names, and each part's
frame equal in both runs (read part by part: memory stays one part pair), with the row count and
a hash of every row (polars hash_rows, summed) per run; and whether the best points agree.
Not a CI test: it takes minutes and ~0.4 GB of Parquet per run (removed unless --keep).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
import time
from pathlib import Path

import polars as pl
from polars.testing import assert_frame_equal

from trainmem.sweep import run_sweep

JOB = {
    "model": "llama-3.1-405b",
    "fleet": ",".join(
        f"16384x{gpu}"
        for gpu in (
            "h100-sxm-80gb",
            "h200-sxm-141gb",
            "b200-180gb",
            "a100-sxm-80gb",
            "mi300x-192gb",
            "mi325x-256gb",
            "h100-pcie-80gb",
            "h100-hbm2e-96gb",
        )
    ),
    "seq_len": 8192,
    "global_batch_size": 2048,
    "max_micro_batch_size": 256,
    "max_pp": 64,
    "max_cp": 32,
}
"""Llama-3.1-405B on eight pools of 16,384 GPUs, wide axes: 20,528,640 points."""


def _timed(**kwargs: object) -> tuple[float, object]:
    start = time.perf_counter()
    run = run_sweep(**JOB, study_name="bench", **kwargs)  # type: ignore[arg-type]
    return time.perf_counter() - start, run


def compare(local: Path, cluster: Path) -> dict[str, object]:
    """Part by part: the same names and equal frames; rows and a row-hash sum per run."""
    names = sorted(p.name for p in local.glob("part-*.parquet"))
    other = sorted(p.name for p in cluster.glob("part-*.parquet"))
    rows = [0, 0]
    hashes = [0, 0]
    for name in names if names == other else []:
        a, b = pl.read_parquet(local / name), pl.read_parquet(cluster / name)
        assert_frame_equal(a, b)
        for i, frame in enumerate((a, b)):
            rows[i] += len(frame)
            hashes[i] = (hashes[i] + int(frame.hash_rows(seed=0).sum())) % 2**64
    return {"parts": len(names), "same_names": names == other, "rows": rows, "hashes": hashes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="Folder for both runs' points (temporary).")
    parser.add_argument("--workers", type=int, default=4, help="LocalCluster worker processes.")
    parser.add_argument("--jobs", type=int, default=2, help="The local run's processes.")
    parser.add_argument("--memory-limit", default="2GiB", help="Per cluster worker.")
    parser.add_argument(
        "--worker-threads",
        default="1",
        help="TRAINMEM_THREADS of each cluster worker (its compiled loop's threads; '' for "
        "numba's default, every core: oversubscribed with several workers on one machine).",
    )
    parser.add_argument("--keep", action="store_true", help="Keep the points.")
    args = parser.parse_args()
    import distributed

    root = Path(args.out or tempfile.mkdtemp(prefix="trainmem-bench-distributed-"))
    try:
        seconds, local = _timed(out=str(root / "local"), jobs=args.jobs)
        num = local.result.num_points  # type: ignore[attr-defined]
        print(f"space: {num:,} points ({JOB['model']} on {JOB['fleet']})")
        print(f"local --jobs {args.jobs}: {seconds:.1f} s ({num / seconds / 1e6:.2f} M points/s)")
        start = time.perf_counter()
        with distributed.LocalCluster(
            n_workers=args.workers,
            threads_per_worker=1,
            processes=True,
            memory_limit=args.memory_limit,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
            env={"TRAINMEM_THREADS": args.worker_threads} if args.worker_threads else {},
        ) as cluster:
            threads = args.worker_threads or "numba's default"
            print(
                f"LocalCluster of {args.workers} workers (TRAINMEM_THREADS {threads}): "
                f"{time.perf_counter() - start:.1f} s to start"
            )
            address = cluster.scheduler_address
            seconds, remote = _timed(out=str(root / "cluster"), scheduler=address)
            print(
                f"--scheduler ({args.workers} workers): {seconds:.1f} s "
                f"({num / seconds / 1e6:.2f} M points/s)"
            )
            seconds, rerun = _timed(out=str(root / "cluster"), scheduler=address)
            skipped = rerun.result.extra["chunks_skipped"]  # type: ignore[attr-defined]
            print(f"rerun through the cluster: {seconds:.1f} s, {skipped} parts skipped")
        check = compare(
            Path(local.result.parquet),  # type: ignore[attr-defined]
            Path(remote.result.parquet),  # type: ignore[attr-defined]
        )
        same_best = local.result.best == remote.result.best  # type: ignore[attr-defined]
        print(
            f"identical points: {check['same_names'] and check['rows'][0] == check['rows'][1]} "
            f"({check['parts']} parts, rows {check['rows'][0]:,} / {check['rows'][1]:,}, "  # type: ignore[index]
            f"row-hash sums {check['hashes'][0]:#x} / {check['hashes'][1]:#x}); "  # type: ignore[index]
            f"same best point: {same_best}"
        )
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
