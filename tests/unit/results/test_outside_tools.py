"""The points folder outside trainmem (issue 16, item 5): DuckDB, polars and pandas read a
sweep's Parquet parts as they lie (OUT/points/study=NAME/part-*.parquet, Hive-style folders),
agree with `trainmem points`, and see the parts' provenance in the Parquet key-value metadata.
The commands are the ones docs/sweep.md shows."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from trainmem.cli import main
from trainmem.results import SCHEMA_VERSION

duckdb = pytest.importorskip("duckdb", reason="duckdb (the test extra) is not installed")
pd = pytest.importorskip("pandas", reason="pandas (the test extra) is not installed")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two studies (sequence 2048 and 4096) of Llama-3.2-1B on 8 x H100 in one folder."""
    folder = tmp_path_factory.mktemp("points")
    for seq in ("2048", "4096"):
        argv = ["sweep", "--model", "llama-3.2-1b", "--seq-len", seq, "--out", str(folder)]
        assert main([*argv, "--json"]) == 0
    return folder


def _best(capsys: pytest.CaptureFixture[str], out: Path) -> dict:
    capsys.readouterr()
    where = "fits AND study LIKE '%s2048%'"
    argv = ["points", str(out), "--where", where, "--sort", "cost_per_million_tokens"]
    assert main([*argv, "--head", "1", "--json"]) == 0
    return json.loads(capsys.readouterr().out)[0]


def test_duckdb_reads_the_folder_with_hive_partitions(
    out: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    glob = f"{out}/points/*/*.parquet"
    rows = duckdb.sql(
        f"SELECT study, count(*) FROM read_parquet('{glob}', hive_partitioning = true) "
        "GROUP BY study ORDER BY study"
    ).fetchall()
    assert [n for _, n in rows] == [86_400, 86_400] and "s2048" in rows[0][0]
    (best,) = duckdb.sql(
        f"SELECT min(cost_per_million_tokens) FROM read_parquet('{glob}', hive_partitioning = "
        "true) WHERE fits AND study LIKE '%s2048%'"
    ).fetchall()
    assert best[0] == _best(capsys, out)["cost_per_million_tokens"]
    described = duckdb.sql(f"DESCRIBE SELECT * FROM read_parquet('{glob}')").fetchall()
    kinds = dict(row[:2] for row in described)
    assert kinds["peak_device_bytes"] == "BIGINT" and kinds["gpu"] == "VARCHAR"


def test_polars_scans_the_folder_with_hive_partitions(out: Path) -> None:
    frame = (
        pl.scan_parquet(out / "points", hive_partitioning=True)
        .filter(pl.col("study").cast(pl.String).str.contains("s4096"))
        .collect()
    )
    assert frame.height == 86_400 and frame["seq_len"].unique().to_list() == [4096]
    assert frame["peak_device_bytes"].dtype == pl.Int64


def test_pandas_reads_the_folder(out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # partitioning=None: `study` is a column of every part (pyarrow would otherwise infer it
    # from the folder names too, as a second dictionary type it cannot merge with the file's).
    frame = pd.read_parquet(out / "points", partitioning=None)
    assert len(frame) == 172_800 and frame["study"].nunique() == 2
    fits = frame[frame["fits"] & frame["study"].str.contains("s2048")]
    assert fits["cost_per_million_tokens"].min() == _best(capsys, out)["cost_per_million_tokens"]


def test_each_part_carries_its_provenance(out: Path) -> None:
    part = next((out / "points").glob("study=*/part-*.parquet"))
    # The file's key-value metadata (pyarrow, `parquet-tools meta`, DuckDB parquet_kv_metadata).
    meta = {k.decode(): v.decode() for k, v in pq.read_metadata(part).metadata.items()}
    assert meta["trainmem_schema_version"] == str(SCHEMA_VERSION)
    assert meta["trainmem_store"] == "all"
    assert meta["trainmem_study"] == part.parent.name.removeprefix("study=")
    assert meta["trainmem_point_range"].split("-")[0].isdigit()
    assert len(meta["trainmem_space_fingerprint"]) == 10
