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
    write_points,
)

SNAPSHOT = [
    ("gpu", "String"),
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
    ("precision", "String"),
    ("optimizer", "String"),
    ("recompute", "String"),
    ("recompute_every", "Int64"),
    ("attention", "String"),
    ("framework", "String"),
    ("ep", "Int64"),
    ("etp", "Int64"),
    ("capacity_factor", "Float64"),
    ("offload", "String"),
    ("lora_rank", "Int64"),
    ("lora_targets", "String"),
    ("qlora", "Boolean"),
    ("loss", "String"),
    ("activation_offload", "Boolean"),
    ("compile", "String"),
    ("optimizer_in_backward", "Boolean"),
    ("allocator", "String"),
    ("dp", "Int64"),
    ("grad_accum_steps", "Int64"),
    ("peak_device_bytes", "Float64"),
    ("parameters", "Float64"),
    ("master_weights", "Float64"),
    ("gradients", "Float64"),
    ("optimizer_states", "Float64"),
    ("activations", "Float64"),
    ("transient", "Float64"),
    ("framework_overhead", "Float64"),
    ("fragmentation", "Float64"),
    ("peak_allocated_bytes", "Float64"),
    ("fits", "Boolean"),
    ("reason", "String"),
    ("step_time_s", "Float64"),
    ("tokens_per_second", "Float64"),
    ("mfu", "Float64"),
    ("cost_per_million_tokens", "Float64"),
    ("model", "String"),
    ("study", "String"),
    ("trial", "Int64"),
]
"""The Parquet schema, frozen: changing it means bumping SCHEMA_VERSION and this list."""


def test_schema_snapshot() -> None:
    assert [(k, str(v)) for k, v in SCHEMA.items()] == SNAPSHOT
    assert SCHEMA_VERSION == 3


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
