"""The heatmap drawing: cell matrices, the fit boundary's edges, the file (size, type, atomic)."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from trainmem.results import heatmap_format, write_heatmap
from trainmem.results._plot import boundary_segments, cell_matrices


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG header (IHDR: bytes 16-24, big-endian)."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def _cells() -> pl.DataFrame:
    # 3 x 2: micro-batch 1, 2, 4 by seq 512, 1024; limit 10 GiB; (4, 1024) an invalid layout.
    return pl.DataFrame(
        {
            "micro_batch_size": [1, 2, 4, 1, 2, 4],
            "seq_len": [512, 512, 512, 1024, 1024, 1024],
            "peak_gib": [3.0, 6.0, 12.0, 6.0, 12.0, None],
            "fits": [True, True, False, True, False, False],
            "valid": [True, True, True, True, True, False],
        }
    )


def test_cell_matrices_place_rows_by_y_and_columns_by_x() -> None:
    m = cell_matrices(
        _cells(), x="micro_batch_size", y="seq_len", x_values=[1, 2, 4, 8], y_values=[512, 1024]
    )
    assert m["peak_gib"].shape == (2, 4)
    np.testing.assert_array_equal(m["peak_gib"][0, :3], [3.0, 6.0, 12.0])
    assert np.isnan(m["peak_gib"][1, 2]) and not m["valid"][1, 2] and m["present"][1, 2]
    assert not m["present"][:, 3].any()  # micro-batch 8: no cell
    np.testing.assert_array_equal(m["fits"], [[1, 1, 0, 0], [1, 0, 0, 0]])


def test_boundary_runs_between_fitting_and_non_fitting_valid_cells() -> None:
    fits = np.array([[1, 1, 0], [1, 0, 0]], dtype=bool)
    valid = np.array([[1, 1, 1], [1, 1, 0]], dtype=bool)
    segments = sorted(boundary_segments(fits, valid))
    assert segments == sorted(
        [
            ((1.5, -0.5), (1.5, 0.5)),  # row 0: between micro-batch 2 (fits) and 4
            ((0.5, 0.5), (0.5, 1.5)),  # row 1: between 1 (fits) and 2
            ((0.5, 0.5), (1.5, 0.5)),  # column 1: between row 0 (fits) and row 1
        ]
    )
    # An invalid neighbour draws no edge; all fitting or none: no boundary at all.
    assert boundary_segments(np.ones((2, 2), bool), np.ones((2, 2), bool)) == []
    assert boundary_segments(np.zeros((2, 2), bool), np.ones((2, 2), bool)) == []


@pytest.mark.parametrize(("name", "fmt"), [("a.png", "png"), ("b.SVG", "svg")])
def test_format_by_extension(name: str, fmt: str) -> None:
    assert heatmap_format(name) == fmt


@pytest.mark.parametrize("name", ["a.jpg", "a", "a.png.txt"])
def test_other_extensions_name_out_and_the_allowed_ones(name: str) -> None:
    with pytest.raises(ValueError, match=r"--out: .*\.png, \.svg"):
        heatmap_format(name)


def test_png_and_svg_files(tmp_path: Path) -> None:
    kwargs = dict(x="micro_batch_size", y="seq_len", limit_gib=10.0, title="test")
    png = write_heatmap(_cells(), tmp_path / "h.png", **kwargs)
    width, height = png_size(png)
    assert (width, height) == (1200, 760)
    svg = write_heatmap(_cells(), tmp_path / "sub" / "h.svg", **kwargs)
    text = svg.read_text()
    assert text.startswith("<?xml") and "<svg" in text
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["h.png", "h.svg", "sub"]  # no temps


def test_bad_input_writes_nothing_and_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "h.png"
    target.write_bytes(b"old")
    with pytest.raises(ValueError, match="lack column"):
        write_heatmap(
            _cells().drop("fits"),
            target,
            x="micro_batch_size",
            y="seq_len",
            limit_gib=10.0,
            title="t",
        )
    with pytest.raises(ValueError, match="no cells"):
        write_heatmap(
            _cells().head(0), target, x="micro_batch_size", y="seq_len", limit_gib=10.0, title="t"
        )
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["h.png"]


def test_missing_matplotlib_is_a_one_line_value_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(ValueError, match=r"pip install 'trainmem\[plot\]'"):
        write_heatmap(
            _cells(),
            tmp_path / "h.png",
            x="micro_batch_size",
            y="seq_len",
            limit_gib=10.0,
            title="t",
        )
    assert not list(tmp_path.iterdir())
