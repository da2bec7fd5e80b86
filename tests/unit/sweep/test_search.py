"""Exhaustive search equals brute force; Optuna reaches the optimum; reruns continue, never
duplicate."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import polars as pl
import pytest

from trainmem.catalog import load_model
from trainmem.engine import (
    estimate,
    estimate_time,
    make_grid,
    overheads_for,
    time_inputs,
)
from trainmem.hardware import load_gpus, parse_fleet
from trainmem.sweep._exhaustive import run_exhaustive
from trainmem.sweep._optuna import run_optuna
from trainmem.sweep._space import AXES, make_space

GPUS = load_gpus()


def small_space(*, tiny: bool = False):
    """Two pools; `tiny`: 512 points, so that a brute-force loop stays under a few seconds."""
    space = make_space(
        load_model("llama-3.2-1b"),
        parse_fleet("8xa100-sxm-40gb,2xl4-24gb", GPUS),
        GPUS,
        seq_len=4096,
        global_batch_size=64,
    )
    axes = {
        **space.axes,
        "num_gpus": (1, 2, 8),
        "tp": (1, 2, 4),
        "pp": (1, 2),
        "cp": (1, 2),
        "virtual_stages": (1,),
        "zero": (0, 1, 3),
        "offload": ("none", "optimizer"),
        "micro_batch_size": (1, 4, 16),
    }
    if tiny:
        axes.update(
            num_gpus=(2, 8),
            tp=(1, 4),
            zero=(0, 3),
            recompute=("none", "full"),
            micro_batch_size=(1, 8),
        )
    return dataclasses.replace(space, axes=axes)


def brute_force_best(space) -> tuple[float, dict]:
    """The cheapest fitting point by a Python loop of single-row engine calls, with the sweep's
    own rules written out again."""
    best = (np.inf, {})
    for values in itertools.product(*(space.axes[a] for a in AXES)):
        point = dict(zip(AXES, values, strict=True))
        pool = space.fleet.pools[point.pop("pool")]
        gpu = GPUS[pool.gpu]
        if point["tp"] > pool.gpus_per_node or point["num_gpus"] > pool.num_gpus:
            continue
        if point["virtual_stages"] > 1 and point["pp"] == 1:
            continue
        grid = make_grid({**space.fixed, **point})
        ov = overheads_for(gpu.arch, cuda_context_bytes=gpu.cuda_context_bytes)
        mem = estimate(space.model, grid, usable_bytes=gpu.usable_bytes, overheads=ov)
        if not mem["fits"][0]:
            continue
        inputs = time_inputs(gpu, price_per_hour_usd=pool.price_per_gpu_hour(gpu))
        inputs["gpus_per_node"] = float(pool.gpus_per_node)
        cost = float(estimate_time(space.model, grid, **inputs)["cost_per_million_tokens"][0])
        if cost < best[0]:
            best = (cost, {"gpu": pool.gpu, **point})
    return best


@pytest.fixture(scope="module")
def space():
    return small_space()


@pytest.fixture(scope="module")
def exhaustive(space, tmp_path_factory):
    out = tmp_path_factory.mktemp("exh")
    return out, run_exhaustive(space, out=out, study="s", chunk_size=400)


def test_exhaustive_equals_brute_force(tmp_path) -> None:
    space = small_space(tiny=True)
    result = run_exhaustive(space, out=tmp_path, study="bf", chunk_size=100)
    assert result.num_points == space.num_points == 512
    cost, point = brute_force_best(space)
    best = result.best[0]
    assert best["fits"]
    assert best["cost_per_million_tokens"] == pytest.approx(cost, rel=1e-12)
    assert {k: best[k] for k in point} == point


def test_exhaustive_stores_every_point_once_and_resumes(space, exhaustive) -> None:
    out, result = exhaustive
    folder = out / "points" / "study=s"
    parts = sorted(folder.glob("part-*.parquet"))
    assert len(parts) == -(-space.num_points // 400)
    assert not list(folder.glob(".tmp-*"))
    frame = pl.read_parquet(parts)
    assert len(frame) == space.num_points == result.num_points
    assert frame["trial"].null_count() == len(frame)
    # A killed sweep: one part lost (never written) -> the rerun writes it and nothing else.
    parts[1].unlink()
    mtimes = {p: p.stat().st_mtime_ns for p in parts if p.exists()}
    again = run_exhaustive(space, out=out, study="s", chunk_size=400)
    assert again.extra["chunks_skipped"] == len(parts) - 1
    assert all(p.stat().st_mtime_ns == t for p, t in mtimes.items())
    frame = pl.read_parquet(sorted(folder.glob("part-*.parquet")))
    config = [c for c in frame.columns if c in (*AXES, "gpu") and c != "pool"]
    assert len(frame) == space.num_points == frame.select(config).unique().height
    assert again.best[0]["cost_per_million_tokens"] == result.best[0]["cost_per_million_tokens"]


OPTUNA_SEED, OPTUNA_TRIALS = 4, 60
"""Pinned: on the full default space of llama-3.2-1b over two pools (172,800 points, 960
layouts), without warm start, the seed-4 study tells the exhaustive optimum within 60 trials
(at trial 43; seeds 2, 3 and 5 need 60-125; seeds 0 and 1 end 150 trials 1.1% above it: TPE is
a heuristic; the exhaustive search is the exact answer). With the warm start every seed 0-5
tells it at trial 2, one of the coarse optimum's layouts (the coarse optimum alone is 1.7%
above). Re-pinned when Megatron's flash attention stopped counting s x s scores, which moved
the optimum, and when the warm start came."""


@pytest.mark.parametrize("warm_start", [True, False])
def test_optuna_reaches_the_optimum_with_a_seed(tmp_path, warm_start) -> None:
    space = make_space(
        load_model("llama-3.2-1b"),
        parse_fleet("8xa100-sxm-40gb,2xl4-24gb", GPUS),
        GPUS,
        seq_len=4096,
        global_batch_size=64,
    )
    exact = run_exhaustive(space, out=tmp_path, study="e").best[0]
    found = run_optuna(
        space,
        out=tmp_path,
        study="o",
        trials=OPTUNA_TRIALS,
        seed=OPTUNA_SEED,
        storage=":memory:",
        warm_start=warm_start,
    )
    assert found.best[0]["cost_per_million_tokens"] == pytest.approx(
        exact["cost_per_million_tokens"], rel=1e-12
    )
    assert found.num_points < space.num_points / 10
    again = run_optuna(
        space,
        out=tmp_path / "b",
        study="o2",
        trials=OPTUNA_TRIALS,
        seed=OPTUNA_SEED,
        storage=":memory:",
        warm_start=warm_start,
    )

    def strip(rows):
        return [{k: v for k, v in r.items() if k != "study"} for r in rows]

    assert strip(again.best) == strip(found.best)  # seeded: reproducible


def test_optuna_rerun_continues_to_the_total(space, tmp_path) -> None:
    first = run_optuna(space, out=tmp_path, study="r", trials=6, seed=1, batch_size=4)
    assert first.extra["complete_trials"] == 6
    assert first.extra["storage"] == ":memory:"  # the default: rebuilt from the points
    second = run_optuna(space, out=tmp_path, study="r", trials=10, seed=1, batch_size=4)
    assert second.extra["complete_trials"] == 10
    assert second.extra["rebuilt_trials"] == 6 and second.extra["warm_start_trials"] == 0
    frame = pl.read_parquet(sorted((tmp_path / "points" / "study=r").glob("part-*.parquet")))
    trials = frame["trial"].unique().to_list()
    assert len(trials) == 10 and set(range(6)) <= set(trials)  # a layout drawn twice is
    # skipped (its number FAIL, `_bounds.fresh_trials`): the numbers may leave gaps
    layout = ["gpu", "num_gpus", "tp", "pp", "cp", "ep", "virtual_stages"]
    assert frame.select("trial", *layout).unique().height == 10  # ten distinct layouts
    assert frame.select(layout).unique().height == 10
    assert frame.select(
        "trial", "zero", "recompute", "offload", "micro_batch_size"
    ).unique().height == len(frame)  # noqa: E501


def test_pareto_front_is_non_dominated(space, tmp_path) -> None:
    result = run_exhaustive(space, out=tmp_path, study="p", objectives=("cost", "time"))
    front = [(r["cost_per_million_tokens"], r["step_time_s"]) for r in result.best]
    assert front == sorted(front)
    assert all(b[1] < a[1] for a, b in itertools.pairwise(front))


KILLED_SWEEP = """
import sys, time
from trainmem.sweep import _parts
from trainmem.sweep._exhaustive import run_exhaustive
sys.path.insert(0, {tests!r})
from test_search import small_space

def slow(done, total):
    time.sleep(0.2)  # leaves time to be killed between (and during) part writes

_parts.PUBLISH_EVERY_S = 0.3  # a batch of parts published every two chunks or so
run_exhaustive(small_space(), out={out!r}, study="k", chunk_size=100, progress=slow)
"""


def test_sigkill_then_rerun_loses_and_duplicates_nothing(tmp_path) -> None:
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    folder = tmp_path / "points" / "study=k"
    code = KILLED_SWEEP.format(tests=str(Path(__file__).parent), out=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 60
        while len(list(folder.glob("part-*.parquet"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    written = len(list(folder.glob("part-*.parquet")))
    space = small_space()
    assert 3 <= written < -(-space.num_points // 100)  # killed mid-sweep
    result = run_exhaustive(space, out=tmp_path, study="k", chunk_size=100)
    assert result.extra["chunks_skipped"] == written
    frame = pl.read_parquet(sorted(folder.glob("part-*.parquet")))
    config = ["gpu", *[a for a in AXES if a != "pool"]]
    assert len(frame) == space.num_points == frame.select(config).unique().height
    assert not list(folder.glob(".tmp-*"))  # the killed run's unpublished parts: removed


def test_exhaustive_over_two_processes_matches(space, exhaustive, tmp_path) -> None:
    _, one = exhaustive
    two = run_exhaustive(space, out=tmp_path, study="s", chunk_size=400, jobs=2)
    assert two.best == one.best
    frame = pl.read_parquet(sorted((tmp_path / "points" / "study=s").glob("part-*.parquet")))
    assert len(frame) == space.num_points


def test_parts_written_in_the_background_equal_parts_written_in_line(space, tmp_path) -> None:
    """One process writes chunk c's part in a thread while chunk c + 1 is evaluated: the same
    files, byte for byte, as writing each part before evaluating the next; a chunk is reported
    only once its part is written (pending: a temporary file until the batch is published)."""
    from trainmem.results._store import publish_pending
    from trainmem.sweep._exhaustive import _exhaustive_chunk, space_fingerprint

    background, in_line = tmp_path / "background", tmp_path / "in-line"
    folder = background / "points" / "study=w"
    on_disk: list[tuple[int, int]] = []

    sizes: list[int] = []

    def progress(done: int, total: int) -> None:
        if done == 0:  # the size it will take, reported before any chunk
            sizes.append(total)
            return
        written = [p for p in folder.iterdir() if p.name.startswith(("part-", ".tmp-"))]
        on_disk.append((done, len(written)))

    result = run_exhaustive(space, out=background, study="w", chunk_size=300, progress=progress)
    assert sizes == [space.num_points]
    num_chunks = -(-space.num_points // 300)
    assert [done for done, _ in on_disk] == [
        min(300 * k, space.num_points) for k in range(1, num_chunks + 1)
    ]
    assert all(parts >= k for k, (_, parts) in enumerate(on_disk, start=1))
    fp = space_fingerprint(space, chunk_size=300)
    pending = []
    for c, lo in enumerate(range(0, space.num_points, 300)):
        *_, written = _exhaustive_chunk(
            space,
            out=in_line,
            study="w",
            part=f"x{fp}-{c:06d}",
            lo=lo,
            hi=min(lo + 300, space.num_points),
            objectives=("cost",),
            keys=["cost_per_million_tokens"],
            top=1,
            distinct=(),
            fingerprint=fp,
        )
        pending.append(written)
    assert not list((in_line / "points" / "study=w").glob("part-*"))  # pending: invisible
    assert publish_pending(pending) == num_chunks
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted(p.name for p in (in_line / "points" / "study=w").iterdir())
    assert len(names) == num_chunks and result.extra["chunks_skipped"] == 0
    for name in names:
        assert (folder / name).read_bytes() == (in_line / "points" / "study=w" / name).read_bytes()


def test_a_failed_background_write_is_raised(space, tmp_path, monkeypatch) -> None:
    from trainmem.sweep import _exhaustive

    real = _exhaustive.write_pending
    calls: list[str] = []
    reported: list[int] = []

    def failing(frame, out, *, study, part, **kwargs):
        calls.append(part)
        if len(calls) == 2:
            raise OSError("No space left on device")
        return real(frame, out, study=study, part=part, **kwargs)

    monkeypatch.setattr(_exhaustive, "write_pending", failing)
    with pytest.raises(OSError, match="No space left"):
        run_exhaustive(
            space,
            out=tmp_path,
            study="f",
            chunk_size=300,
            progress=lambda done, total: reported.append(done),
        )
    assert reported == [0, 300]  # the size, then the first chunk only: the second's part
    # never reached the disk
    parts = sorted(p.name for p in (tmp_path / "points" / "study=f").glob("part-*.parquet"))
    # The parts written before and after the failed one are published, whole; it is absent.
    assert calls[1] not in str(parts) and calls[0] in str(parts) and calls[2] in str(parts)
    assert not list((tmp_path / "points" / "study=f").glob(".tmp-*"))
    monkeypatch.setattr(_exhaustive, "write_pending", real)
    rerun = run_exhaustive(space, out=tmp_path, study="f", chunk_size=300)
    assert rerun.extra["chunks_skipped"] == len(parts)
    frame = pl.read_parquet(sorted((tmp_path / "points" / "study=f").glob("part-*.parquet")))
    assert len(frame) == space.num_points
