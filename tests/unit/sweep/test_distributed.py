"""`--scheduler`: an exhaustive sweep's chunks on a Dask cluster (a LocalCluster of 4 worker
processes here) write the same points as a local run, to a folder, a file:// URL or an object
store; reruns skip the parts written; a bad scheduler is one line, exit 2, nothing written.
Optuna's workers on a cluster need a database server (PostgreSQL: TRAINMEM_TEST_POSTGRES_URL)."""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from trainmem.cli import main
from trainmem.hardware import load_gpus, parse_fleet
from trainmem.results import scan_points
from trainmem.sweep import _cluster, run_sweep
from trainmem.sweep._exhaustive import run_exhaustive
from trainmem.sweep._optuna import run_optuna
from trainmem.sweep._space import make_space

distributed = pytest.importorskip("distributed", reason="the distributed extra is not installed")

GPUS = load_gpus()
FLEET = "8xh100-sxm-80gb,8xa100-sxm-80gb"
"""172,800 points: two parts of the CLI's 100,000-point chunks."""
CHUNK = 20_000
"""The Python API's chunks: 5 parts of the 86,400-point default space."""
POSTGRES_ENV = "TRAINMEM_TEST_POSTGRES_URL"


@pytest.fixture(scope="module")
def scheduler():
    """A LocalCluster of 4 single-threaded worker processes (1 GiB each), closed after the
    module's tests."""
    cluster = distributed.LocalCluster(
        n_workers=4,
        threads_per_worker=1,
        processes=True,
        memory_limit="1GiB",
        dashboard_address=":0",
        silence_logs=logging.ERROR,
    )
    try:
        yield cluster.scheduler_address
    finally:
        cluster.close()


def _space():
    from trainmem.catalog import load_model

    return make_space(
        load_model("llama-3.1-8b"),
        parse_fleet("8xh100-sxm-80gb", GPUS),
        GPUS,
        seq_len=4096,
        global_batch_size=256,
    )


def _points(out: str | Path) -> pl.DataFrame:
    """Every stored point, sorted by every column (part boundaries and order ignored)."""
    frame = scan_points(out).collect()
    return frame.sort(frame.columns, nulls_last=True)


def _sweep(capsys, *args: str) -> dict:
    assert main(["sweep", "--fleet", FLEET, "--json", *args]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _same_answer(a: dict, b: dict) -> None:
    for key in ("best", "top", "num_points", "num_points_stored", "closest"):
        assert a[key] == b[key], key


def test_cli_cluster_writes_the_points_of_a_local_run(capsys, tmp_path, scheduler) -> None:
    local = _sweep(capsys, "--out", str(tmp_path / "local"))
    remote = _sweep(capsys, "--out", str(tmp_path / "cluster"), "--scheduler", scheduler)
    _same_answer(local, remote)
    assert len(list(Path(remote["parquet"]).glob("part-*.parquet"))) == 2
    assert_frame_equal(_points(tmp_path / "local"), _points(tmp_path / "cluster"))
    again = _sweep(capsys, "--out", str(tmp_path / "cluster"), "--scheduler", scheduler)
    assert again["chunks_skipped"] == 2  # the rerun skips what the cluster wrote
    _same_answer(local, again)


def test_cli_cluster_writes_to_a_file_url(capsys, tmp_path, scheduler) -> None:
    url = (tmp_path / "shared").as_uri()  # file:///...: a folder, as every node sees it
    local = _sweep(capsys, "--out", str(tmp_path / "local"))
    remote = _sweep(capsys, "--out", url, "--scheduler", scheduler.replace("tcp://", "dask://"))
    _same_answer(local, remote)
    assert_frame_equal(_points(tmp_path / "local"), _points(url))
    assert main(["points", url, "--where", "fits", "--head", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["fits"] is True


def test_python_api_cluster_equals_local_and_reruns_skip(tmp_path, scheduler) -> None:
    space = _space()
    local = run_exhaustive(space, out=tmp_path / "local", study="s", chunk_size=CHUNK)
    remote = run_exhaustive(
        space, out=tmp_path / "cluster", study="s", chunk_size=CHUNK, scheduler=scheduler
    )
    assert remote.best == local.best
    assert_frame_equal(remote.top, local.top)
    assert_frame_equal(_points(tmp_path / "local"), _points(tmp_path / "cluster"))
    again = run_exhaustive(
        space, out=tmp_path / "cluster", study="s", chunk_size=CHUNK, scheduler=scheduler
    )
    assert again.extra["chunks_skipped"] == 5 and again.best == local.best
    run = run_sweep(out=str(tmp_path / "api"), scheduler=scheduler)  # the public API's option
    assert [{**r, "study": "s"} for r in run.result.best] == local.best


def test_progress_arrives_in_chunk_order(tmp_path, scheduler) -> None:
    seen: list[int] = []
    run_exhaustive(
        _space(),
        out=tmp_path,
        study="p",
        chunk_size=CHUNK,
        scheduler=scheduler,
        progress=lambda done, total: seen.append(done),
    )
    assert seen == [0, 20_000, 40_000, 60_000, 80_000, 86_400]  # the size first


def test_object_store_parts_are_put_in_place(tmp_path) -> None:
    """An in-memory object store (fsspec memory://): no temporaries, nothing to publish; the
    same points, a rerun skips them, and every reader takes the URL. A cluster's workers in
    threads share this process's memory store."""
    space = _space()
    url = f"memory://bucket-{uuid.uuid4().hex[:8]}/sweeps"
    local = run_exhaustive(space, out=tmp_path, study="s", chunk_size=CHUNK)
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, protocol="tcp", dashboard_address=":0"
    ) as cluster:
        put = run_exhaustive(
            space, out=url, study="s", chunk_size=CHUNK, scheduler=cluster.scheduler_address
        )
    assert put.parquet == f"{url}/points/study=s"
    assert put.best == local.best
    assert_frame_equal(_points(tmp_path), _points(url))
    again = run_exhaustive(space, out=url, study="s", chunk_size=CHUNK)
    assert again.extra["chunks_skipped"] == 5 and again.best == local.best


@pytest.mark.parametrize(
    ("address", "why"),
    [("tcp://127.0.0.1:1", "cannot reach tcp://127.0.0.1:1"), ("yarn", "unknown value 'yarn'")],
)
def test_bad_scheduler_is_one_line_and_writes_nothing(
    capsys, tmp_path, monkeypatch, address, why
) -> None:
    monkeypatch.setattr(_cluster, "CONNECT_TIMEOUT_S", 1.0)
    out = tmp_path / "out"
    assert main(["sweep", "--out", str(out), "--scheduler", address]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "scheduler" in lines[0] and why in lines[0], err
    assert not out.exists()


def test_jobs_with_a_cluster_is_refused(tmp_path, scheduler) -> None:
    with pytest.raises(ValueError, match="scheduler: --jobs 2"):
        run_exhaustive(_space(), out=tmp_path, study="s", jobs=2, scheduler=scheduler)


def test_parse_scheduler() -> None:
    assert _cluster.parse_scheduler(None) is None
    assert _cluster.parse_scheduler("local") is None
    assert _cluster.parse_scheduler("dask://head:8786") == "tcp://head:8786"
    assert _cluster.parse_scheduler("tls://10.0.0.1:8786/") == "tls://10.0.0.1:8786"
    for bad in ("head:8786", "ray://head:10001", "tcp://head"):
        with pytest.raises(ValueError, match="scheduler: unknown value"):
            _cluster.parse_scheduler(bad)


@pytest.mark.parametrize("storage", [None, "sqlite:///optuna.db", ":memory:"])
def test_optuna_on_a_cluster_needs_a_database_server(tmp_path, storage) -> None:
    with pytest.raises(ValueError, match="^scheduler: .*postgresql"):
        run_optuna(
            _space(),
            out=tmp_path,
            study="o",
            trials=4,
            storage=storage,
            workers=2,
            scheduler="tcp://127.0.0.1:1",
        )
    assert not any(tmp_path.iterdir())


def test_optuna_workers_on_a_cluster(tmp_path, scheduler) -> None:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"{POSTGRES_ENV} is not set: no PostgreSQL server (.ci/run starts one)")
    pytest.importorskip("psycopg", reason="psycopg (the test extra) is not installed")
    study = f"dask-{uuid.uuid4().hex[:8]}"
    result = run_optuna(
        _space(),
        out=tmp_path,
        study=study,
        trials=8,
        seed=0,
        storage=url,
        workers=2,
        batch_size=2,
        warm_start=False,
        scheduler=scheduler,
    )
    assert result.extra["complete_trials"] == 8
    points = _points(tmp_path)
    assert points["trial"].n_unique() == 8
