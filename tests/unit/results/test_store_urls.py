"""The points table on a URL: an object store's parts put in place (fsspec's memory://), another
filesystem's through a temporary moved to its name (pyarrow's mock://), file:// as a path; every
reader (scan_points, query_points, read_metadata, part_exists) takes the URL."""

from __future__ import annotations

import uuid

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from trainmem.results import part_exists, query_points, read_metadata, scan_points
from trainmem.results._store import (
    HOST_TAG,
    clean_temporaries,
    is_url,
    local_path,
    points_frame,
    read_part,
    study_dir,
    study_location,
    url_filesystem,
    write_pending,
)

pytest.importorskip("fsspec", reason="fsspec (the distributed extra) is not installed")


def _frame(n: int = 5) -> pl.DataFrame:
    return points_frame(
        {
            "gpu": np.array(["h100-sxm-80gb"] * n, dtype=object),
            "num_gpus": np.arange(1, n + 1),
            "peak_device_bytes": np.linspace(1e9, 5e9, n),
            "fits": np.arange(n) % 2 == 0,
            "study": "s",
        }
    )


def _names(url: str) -> list[str]:
    fs, root = url_filesystem(url)
    import pyarrow.fs as pafs

    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.File)


@pytest.mark.parametrize("scheme", ["memory", "mock"])
def test_parts_on_a_url_are_whole_under_their_names(scheme) -> None:
    url = f"{scheme}://bucket-{uuid.uuid4().hex[:8]}/sweeps"
    frame = _frame()
    assert not part_exists(url, study="s", part="x1")
    assert write_pending(frame, url, study="s", part="x1", provenance={"store": "all"}) is None
    assert _names(url) == ["part-x1.parquet"]  # no temporary left, nothing to publish
    assert part_exists(url, study="s", part="x1")
    assert_frame_equal(read_part(url, study="s", part="x1"), frame)
    write_pending(_frame(3), url, study="s", part="x2")
    points = scan_points(url).collect()
    assert len(points) == 8 and points["gpu"].dtype == pl.String
    assert query_points(url, where="fits", head=None).height == 5
    if scheme == "memory":  # one store for every URL in it (pyarrow's mock:// is per URL)
        meta = read_metadata(f"{study_location(url, 's')}/part-x1.parquet")
        assert meta["trainmem_study"] == "s" and meta["trainmem_store"] == "all"


def test_dead_writers_temporaries_on_a_url_are_removed() -> None:
    url = f"mock://bucket-{uuid.uuid4().hex[:8]}"
    write_pending(_frame(), url, study="s", part="x1")
    fs, root = url_filesystem(url)
    folder = f"{root}/points/study=s".lstrip("/")
    dead = f"{folder}/.tmp-{HOST_TAG}-999999999-abc.parquet"  # no such pid
    with fs.open_output_stream(dead) as fh:
        fh.write(b"torn")
    assert clean_temporaries(url, study="s") == 1
    assert _names(url) == ["part-x1.parquet"]


def test_object_stores_have_no_temporaries() -> None:
    assert clean_temporaries(f"memory://b-{uuid.uuid4().hex[:8]}", study="s") == 0


def test_a_url_without_parts_names_itself() -> None:
    url = f"memory://empty-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ValueError, match=f"^points: no part-\\*.parquet files under '{url}'"):
        scan_points(url)


def test_a_bad_part_on_a_url_is_one_line() -> None:
    url = f"memory://bad-{uuid.uuid4().hex[:8]}"
    fs, root = url_filesystem(url)
    with fs.open_output_stream(f"{root}/points/study=s/part-x.parquet") as fh:
        fh.write(b"not parquet at all")
    with pytest.raises(ValueError, match="^points: .*part-x.parquet: not a Parquet file$"):
        query_points(url)


def test_file_urls_are_paths(tmp_path) -> None:
    url = tmp_path.as_uri()
    assert not is_url(url) and local_path(url) == tmp_path
    assert study_dir(url, "s") == tmp_path / "points" / "study=s"
    pending = write_pending(_frame(), url, study="s", part="x1")
    assert pending is not None and pending.tmp.startswith(str(tmp_path))  # published as before


def test_url_schemes() -> None:
    assert is_url("s3://bucket/x") and is_url("hdfs://namenode:8020/x") and is_url("gs://b")
    assert not is_url("out") and not is_url("/shared/sweeps") and not is_url("file:///x")
    assert study_location("s3://bucket/sweeps/", "s") == "s3://bucket/sweeps/points/study=s"
    with pytest.raises(ValueError, match="^out: 's3://b' is a URL"):
        study_dir("s3://b", "s")
    with pytest.raises(ValueError, match="^out: cannot open 'nosuchscheme://x'"):
        url_filesystem("nosuchscheme://x")
