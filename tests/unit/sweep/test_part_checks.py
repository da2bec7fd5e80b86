"""A resumed exhaustive sweep trusts a stored part only once its content agrees with its name:
a part holding another chunk's rows, a damaged file (garbage, truncated, flipped bytes) or an
old part without metadata whose rows differ is named on stderr (one line) and written again; the
resumed points equal an uninterrupted sweep's, with no row doubled or missing."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from trainmem.results import read_metadata
from trainmem.sweep._exhaustive import run_exhaustive
from trainmem.sweep._space import AXES

sys.path.insert(0, str(Path(__file__).parent))
from test_search import small_space  # noqa: E402

CHUNK = 400
CONFIG = ["gpu", *[a for a in AXES if a != "pool"]]


def _parts(out: Path, study: str = "x") -> list[Path]:
    return sorted((out / "points" / f"study={study}").glob("part-*.parquet"))


def _points(out: Path, study: str = "x") -> pl.DataFrame:
    frame = pl.read_parquet(_parts(out, study)).with_columns(pl.col(pl.Categorical).cast(pl.String))
    return frame.drop("study").sort(CONFIG)


@pytest.fixture(scope="module")
def space():
    return small_space()


@pytest.fixture(scope="module")
def clean(space, tmp_path_factory) -> tuple[Path, pl.DataFrame, float]:
    out = tmp_path_factory.mktemp("clean")
    result = run_exhaustive(space, out=out, study="x", chunk_size=CHUNK)
    return out, _points(out), result.best[0]["cost_per_million_tokens"]


def _copy(clean_out: Path, tmp_path: Path) -> list[Path]:
    shutil.copytree(clean_out / "points", tmp_path / "points")
    return _parts(tmp_path)


def _resume(space, tmp_path, capsys, clean) -> list[str]:
    """Resume into `tmp_path`; its points and optimum equal the clean sweep's; stderr's lines."""
    _, points, best = clean
    result = run_exhaustive(space, out=tmp_path, study="x", chunk_size=CHUNK)
    assert_frame_equal(_points(tmp_path), points)
    assert result.best[0]["cost_per_million_tokens"] == best
    assert not [p for p in (tmp_path / "points" / "study=x").iterdir() if p.name.startswith(".")]
    return capsys.readouterr().err.splitlines()


def test_parts_record_their_chunk_and_rows(clean) -> None:
    out, _, _ = clean
    first = _parts(out)[0]
    meta = read_metadata(first)
    assert meta["trainmem_chunk"] == first.name[len("part-") : -len(".parquet")]
    assert int(meta["trainmem_num_rows"]) == pq.ParquetFile(first).metadata.num_rows == CHUNK


def test_an_intact_resume_rebuilds_nothing(space, tmp_path, capsys, clean) -> None:
    _copy(clean[0], tmp_path)
    result = run_exhaustive(space, out=tmp_path, study="x", chunk_size=CHUNK)
    assert result.extra["chunks_skipped"] == len(_parts(tmp_path))
    assert capsys.readouterr().err == ""


def test_a_part_holding_another_chunks_rows_is_rebuilt(space, tmp_path, capsys, clean) -> None:
    parts = _copy(clean[0], tmp_path)
    shutil.copyfile(parts[1], parts[0])  # chunk 1's rows under chunk 0's name
    err = _resume(space, tmp_path, capsys, clean)
    assert err == [err[0]] and err[0].startswith(f"rebuilding damaged part {parts[0]}: ")


def test_an_old_part_without_metadata_holding_another_chunks_rows_is_rebuilt(
    space, tmp_path, capsys, clean
) -> None:
    parts = _copy(clean[0], tmp_path)
    pl.read_parquet(parts[1]).write_parquet(parts[0])  # no trainmem metadata at all
    err = _resume(space, tmp_path, capsys, clean)
    assert len(err) == 1 and "column is not its chunk" in err[0]


def test_an_old_part_without_metadata_of_the_right_rows_is_kept(
    space, tmp_path, capsys, clean
) -> None:
    parts = _copy(clean[0], tmp_path)
    pl.read_parquet(parts[0]).write_parquet(parts[0])
    assert _resume(space, tmp_path, capsys, clean) == []


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(b"not parquet at all\n" * 100)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(200, len(data) - 200, 97):  # the data pages, not only the footer
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _empty(path: Path) -> None:
    path.write_bytes(b"")


@pytest.mark.parametrize("damage", [_truncate, _garbage, _flip, _empty])
def test_a_damaged_part_is_named_and_rebuilt(space, tmp_path, capsys, clean, damage) -> None:
    parts = _copy(clean[0], tmp_path)
    damage(parts[2])
    err = _resume(space, tmp_path, capsys, clean)
    assert len(err) == 1 and err[0].startswith(f"rebuilding damaged part {parts[2]}: ")


def test_a_partial_store_part_with_other_rows_is_rebuilt(space, tmp_path, capsys) -> None:
    run_exhaustive(space, out=tmp_path, study="f", chunk_size=CHUNK, store="fits")
    parts = _parts(tmp_path, "f")
    before = _points(tmp_path, "f")
    fewer = pl.read_parquet(parts[0]).head(1)
    fewer.write_parquet(parts[0])  # an old part (no metadata) missing rows
    run_exhaustive(space, out=tmp_path, study="f", chunk_size=CHUNK, store="fits")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"rebuilding damaged part {parts[0]}: ")
    assert_frame_equal(_points(tmp_path, "f"), before)
