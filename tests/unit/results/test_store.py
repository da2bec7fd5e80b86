"""The points table: a frozen schema, atomic parts with provenance metadata, queries."""

from __future__ import annotations

import os

import numpy as np
import polars as pl
import pytest

from trainmem.results import (
    SCHEMA,
    SCHEMA_VERSION,
    points_frame,
    query_points,
    read_metadata,
    scan_points,
    write_points,
)
from trainmem.results._schema import READ_SCHEMA

SNAPSHOT = [
    ("gpu", "Categorical"),
    ("micro_batch_size", "Int64"),
    ("seq_len", "Int64"),
    ("num_gpus", "Int64"),
    ("global_batch_size", "Int64"),
    ("tp", "Int64"),
    ("pp", "Int64"),
    ("cp", "Int64"),
    ("virtual_stages", "Int64"),
    ("zero", "Int64"),
    ("dp_shard", "Int64"),
    ("sequence_parallel", "Boolean"),
    ("precision", "Categorical"),
    ("optimizer", "Categorical"),
    ("recompute", "Categorical"),
    ("recompute_every", "Int64"),
    ("attention", "Categorical"),
    ("framework", "Categorical"),
    ("ep", "Int64"),
    ("etp", "Int64"),
    ("capacity_factor", "Float64"),
    ("offload", "Categorical"),
    ("lora_rank", "Int64"),
    ("lora_targets", "Categorical"),
    ("qlora", "Boolean"),
    ("loss", "Categorical"),
    ("activation_offload", "Boolean"),
    ("compile", "Categorical"),
    ("optimizer_in_backward", "Boolean"),
    ("allocator", "Categorical"),
    ("load", "Categorical"),
    ("bitsandbytes_version", "Categorical"),
    ("rl", "Categorical"),
    ("rollout", "Categorical"),
    ("rollout_tp", "Int64"),
    ("rollout_gpu_memory_utilization", "Float64"),
    ("rl_group_size", "Int64"),
    ("response_len", "Int64"),
    ("rollout_batch_size", "Int64"),
    ("rollout_max_num_seqs", "Int64"),
    ("rollout_max_num_batched_tokens", "Int64"),
    ("rollout_sleep_level", "Int64"),
    ("ref_model", "Categorical"),
    ("rl_trainer_offload", "Categorical"),
    ("log_prob_micro_batch_size", "Int64"),
    ("rl_max_token_len_per_gpu", "Int64"),
    ("rl_mean_seq_len", "Int64"),
    ("images_per_sample", "Int64"),
    ("image_size", "Int64"),
    ("freeze_vision", "Boolean"),
    ("lora_scope", "Categorical"),
    ("zero_bucket_elems", "Float64"),
    ("overlap_comm", "Categorical"),
    ("dp", "Int64"),
    ("grad_accum_steps", "Int64"),
    ("peak_device_bytes", "Int64"),
    ("parameters", "Int64"),
    ("master_weights", "Int64"),
    ("gradients", "Int64"),
    ("optimizer_states", "Int64"),
    ("activations", "Int64"),
    ("transient", "Int64"),
    ("framework_overhead", "Int64"),
    ("fragmentation", "Int64"),
    ("peak_allocated_bytes", "Int64"),
    ("peak_load_bytes", "Int64"),
    ("peak_device_bytes_low", "Int64"),
    ("peak_device_bytes_high", "Int64"),
    ("fits", "Boolean"),
    ("fit_probability", "Float64"),
    ("reason", "Categorical"),
    ("step_time_s", "Float64"),
    ("tokens_per_second", "Float64"),
    ("mfu", "Float64"),
    ("cost_per_million_tokens", "Float64"),
    ("oom_probability", "Float64"),
    ("worst_step_peak_device_bytes", "Int64"),
    ("step_peak_p50_device_bytes", "Int64"),
    ("step_peak_p99_device_bytes", "Int64"),
    ("model", "Categorical"),
    ("study", "Categorical"),
    ("trial", "Int64"),
]
"""The Parquet schema, frozen: changing it means bumping SCHEMA_VERSION and this list."""


def test_schema_snapshot() -> None:
    assert [(k, str(v)) for k, v in SCHEMA.items()] == SNAPSHOT
    assert SCHEMA_VERSION == 12


def _frame(n: int = 5) -> pl.DataFrame:
    return points_frame(
        {
            "gpu": np.array(["h100-sxm-80gb"] * n, dtype=object),
            "num_gpus": np.arange(1, n + 1),
            "micro_batch_size": np.ones(n, dtype=np.int64),
            "fits": np.arange(n) % 2 == 0,
            "cost_per_million_tokens": np.linspace(1.0, 0.2, n),
            "reason": np.array([""] * n, dtype=object),
            "study": np.array(["s"] * n, dtype=object),
        }
    )


def test_write_is_atomic_with_provenance(tmp_path) -> None:
    path = write_points(_frame(), tmp_path, study="s", part="x-000000", trial="")
    assert path == tmp_path / "points" / "study=s" / "part-x-000000.parquet"
    assert os.listdir(path.parent) == [path.name]  # no temporary file left behind
    meta = read_metadata(path)
    assert meta["trainmem_schema_version"] == str(SCHEMA_VERSION)
    assert meta["trainmem_study"] == "s" and "trainmem_version" in meta
    frame = pl.read_parquet(path)
    assert dict(frame.schema) == dict(SCHEMA)
    assert frame["trial"].null_count() == 5  # absent columns are null, typed


def test_bad_study_name(tmp_path) -> None:
    with pytest.raises(ValueError, match="study"):
        write_points(_frame(), tmp_path, study="../x", part="p")


def test_query_where_sort_head(tmp_path) -> None:
    write_points(_frame(), tmp_path, study="s", part="a")
    got = query_points(tmp_path, where="fits AND num_gpus >= 2", sort="cost_per_million_tokens")
    assert got["num_gpus"].to_list() == [5, 3]
    assert query_points(tmp_path, head=2).height == 2
    with pytest.raises(ValueError, match="--where"):
        query_points(tmp_path, where="no_such_column > 1")
    with pytest.raises(ValueError, match="--sort"):
        query_points(tmp_path, sort="nope")
    with pytest.raises(ValueError, match="no part"):
        query_points(tmp_path / "empty")


def test_byte_columns_are_whole_bytes(tmp_path) -> None:
    """Bytes given as floats are rounded to the byte (NaN and infinities: null), Int64."""
    frame = points_frame(
        {
            "peak_device_bytes": np.array([1.4, 2.6, np.nan, np.inf, 7e10 + 0.75]),
            "parameters": pl.Series([1.0, 2.0, 3.0, 4.0, 5.0]),
            "step_time_s": np.array([np.nan, 1.0, 2.0, 3.0, 4.0]),
            "study": "s",
        }
    )
    assert frame["peak_device_bytes"].to_list() == [1, 3, None, None, 70_000_000_001]
    assert frame["step_time_s"].is_nan()[0]  # other floats keep NaN (an invalid point's time)
    assert frame["parameters"].dtype == pl.Int64
    path = write_points(frame, tmp_path, study="s", part="b")
    assert pl.read_parquet(path)["peak_device_bytes"].to_list() == [1, 3, None, None, 7e10 + 1]
    assert pl.read_parquet(path)["parameters"].to_list() == [1, 2, 3, 4, 5]


def test_schema_3_parts_read_as_schema_4(tmp_path) -> None:
    """Parts written before schema 4 (String, Float64 bytes), alone or beside schema-4 parts,
    read as READ_SCHEMA: strings, whole bytes (rounded)."""
    from tests._points import rewrite_as_schema_3

    write_points(_frame(), tmp_path, study="new", part="a")
    old = write_points(
        _frame().with_columns(pl.lit(5e9, dtype=pl.Float64).alias("peak_device_bytes")),
        tmp_path,
        study="old",
        part="a",
    )
    rewrite_as_schema_3(old, add_bytes=0.4)
    assert read_metadata(old)["trainmem_schema_version"] == "3"
    assert pl.read_parquet(old)["peak_device_bytes"].dtype == pl.Float64
    for path in (tmp_path / "points" / "study=old", tmp_path):
        got = query_points(path, head=None)
        assert dict(got.schema) == dict(READ_SCHEMA)
    old_rows = query_points(tmp_path, where="peak_device_bytes IS NOT NULL", head=None)
    assert old_rows["peak_device_bytes"].to_list() == [5_000_000_000] * 5
    assert old_rows["gpu"].to_list() == ["h100-sxm-80gb"] * 5
    assert query_points(tmp_path, where="gpu LIKE 'h100%'", head=None).height == 10


def test_schema_6_parts_read_with_null_error_bars(tmp_path) -> None:
    """A part written before the error bars (schema 6: no peak_device_bytes_low/_high,
    fit_probability), alone or beside a schema-7 part, reads as READ_SCHEMA with them null."""
    new = _frame().with_columns(pl.lit(0.5).alias("fit_probability"))
    write_points(new, tmp_path, study="new", part="a")
    old = write_points(_frame(), tmp_path, study="old", part="a")
    pl.read_parquet(old).drop(
        "peak_device_bytes_low", "peak_device_bytes_high", "fit_probability"
    ).write_parquet(old)
    for path in (tmp_path / "points" / "study=old", tmp_path):
        got = query_points(path, head=None)
        assert dict(got.schema) == dict(READ_SCHEMA)
    assert query_points(tmp_path, where="fit_probability IS NULL", head=None).height == 5
    assert query_points(tmp_path, where="fit_probability = 0.5", head=None).height == 5


def test_string_columns_are_dictionary_encoded_and_read_as_strings(tmp_path) -> None:
    """Stored dictionary-encoded (Categorical: a dictionary of the names and small codes);
    pyarrow, DuckDB and scan_points read strings, polars a Categorical of the same names."""
    import pyarrow.parquet as pq

    duckdb = pytest.importorskip("duckdb", reason="duckdb (the test extra) is not installed")
    path = write_points(_frame(), tmp_path, study="s", part="d")
    strings = [name for name, dtype in READ_SCHEMA.items() if dtype == pl.String]
    assert {"gpu", "model", "study", "reason", "recompute", "precision"} <= set(strings)
    chunk = pq.ParquetFile(path).metadata.row_group(0)
    encodings = {
        chunk.column(i).path_in_schema: chunk.column(i).encodings for i in range(chunk.num_columns)
    }
    assert all("RLE_DICTIONARY" in encodings[name] for name in strings)
    table = pq.read_table(path)
    assert table.column("gpu").to_pylist() == ["h100-sxm-80gb"] * 5
    assert all(str(table.schema.field(n).type.value_type) == "string" for n in strings)
    described = duckdb.sql(f"DESCRIBE SELECT * FROM read_parquet('{path}')").fetchall()
    types = {row[0]: row[1] for row in described}
    assert all(types[name] == "VARCHAR" for name in strings)
    assert duckdb.sql(f"SELECT DISTINCT study FROM read_parquet('{path}')").fetchall() == [("s",)]
    assert types["peak_device_bytes"] == "BIGINT"
    scanned = pl.scan_parquet(path).collect()
    assert scanned["gpu"].dtype == pl.Categorical
    assert scanned["gpu"].cast(pl.String).to_list() == ["h100-sxm-80gb"] * 5
    assert dict(scan_points(tmp_path).collect_schema()) == dict(READ_SCHEMA)


def test_pending_parts_are_invisible_until_published(tmp_path) -> None:
    """write_pending leaves a temporary file (not a part); publish_pending links each once,
    keeping a part that exists (another writer's), and leaves no temporary."""
    from trainmem.results._store import part_exists, publish_pending, write_pending

    first = write_pending(_frame(), tmp_path, study="p", part="a", provenance={"store": "fits"})
    second = write_pending(_frame(3), tmp_path, study="p", part="a")
    folder = tmp_path / "points" / "study=p"
    assert not part_exists(tmp_path, study="p", part="a")
    assert all(p.name.startswith(".tmp-") for p in folder.iterdir())
    assert publish_pending([first, second]) == 1  # the second finds the first's part
    assert sorted(p.name for p in folder.iterdir()) == ["part-a.parquet"]
    assert read_metadata(first.path)["trainmem_store"] == "fits"
    assert pl.read_parquet(first.path).height == 5
