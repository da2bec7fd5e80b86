"""`trainmem heatmap`: each cell is the one-row estimate, the boundary is the GPU's limit, the
file is a PNG/SVG of the right size, stored points give the best point per cell, and bad input
is one line, exit code 2, nothing written."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import polars as pl
import pytest

from trainmem.cli import main
from trainmem.engine import RECOMPUTE
from trainmem.hardware import get_gpu
from trainmem.sweep._heatmap import default_values

JOB = [
    *("--model", "llama-3.1-8b", "--gpu", "h100-sxm-80gb", "--num-gpus", "8", "--zero", "3"),
    *("--precision", "amp-bf16", "--recompute", "none"),
]
"""Llama-3.1-8B on 8 x H100, ZeRO-3, amp-bf16, no recompute (not the one-job defaults'
mixed-bf16 and full recompute): its boundary moves within the grid below."""


def _json(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> tuple[dict, Path]:
    """micro-batch 1, 4, 16 x seq 1024, 4096 of Llama-3.1-8B on 8 x H100, ZeRO-3, as JSON."""
    out = tmp_path_factory.mktemp("heatmap") / "h.png"
    argv = [
        "heatmap",
        *JOB,
        "--x-values",
        "1,4,16",
        "--y-values",
        "1024,4096",
        "--out",
        str(out),
        "--json",
    ]
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(argv) == 0
    return json.loads(buffer.getvalue()), out


@pytest.mark.parametrize(("mbs", "seq"), [(1, 1024), (4, 4096), (16, 4096)])
def test_cell_equals_single_row_estimate(grid, capsys, mbs: int, seq: int) -> None:
    report, _ = grid
    cell = next(c for c in report["cells"] if (c["micro_batch_size"], c["seq_len"]) == (mbs, seq))
    one = _json(
        capsys, ["estimate", *JOB, "--micro-batch-size", str(mbs), "--seq-len", str(seq), "--json"]
    )
    assert cell["peak_device_bytes"] == one["peak_device_bytes"]
    assert cell["fits"] is one["fits"]
    assert cell["headroom_bytes"] == pytest.approx(one["headroom_bytes"], abs=1)


def test_fits_is_the_gpu_limit_and_the_file_is_a_large_png(grid) -> None:
    report, out = grid
    usable = get_gpu("h100-sxm-80gb").usable_bytes
    assert report["gpu"]["usable_bytes"] == usable and report["headroom"] == 0.10
    assert report["limit_bytes"] == round(usable * 0.9)
    cells = report["cells"]
    assert len(cells) == 6 and {c["valid"] for c in cells} == {True}
    for c in cells:
        assert c["fits"] is (c["peak_device_bytes"] <= usable * 0.9)
        assert c["peak_gib"] == pytest.approx(c["peak_device_bytes"] / 2**30)
    # the boundary: some cells fit, some do not, and it moves left as the sequence grows
    assert report["fitting_x_values"] == {"1024": [1, 4], "4096": [1]}
    width, height = _png_size(out)
    assert width >= 600 and height >= 400


def test_invalid_layouts_are_cells_with_a_reason(capsys, tmp_path) -> None:
    report = _json(
        capsys,
        [
            "heatmap",
            "--model",
            "llama-3.1-8b",
            "--num-gpus",
            "8",
            "--x",
            "tp",
            "--x-values",
            "1,3,8",
            "--y",
            "zero",
            "--y-values",
            "0,3",
            "--out",
            str(tmp_path / "t.svg"),
            "--json",
        ],
    )
    by_tp = {(c["tp"], c["zero"]): c for c in report["cells"]}
    bad = by_tp[(3, 0)]
    assert bad["valid"] is False and bad["fits"] is False and bad["peak_device_bytes"] is None
    assert "divisible" in bad["reason"]
    assert by_tp[(8, 3)]["valid"] is True and by_tp[(8, 3)]["reason"] == ""
    assert (tmp_path / "t.svg").read_text().lstrip().startswith("<?xml")


def test_default_ranges() -> None:
    config = {"tp": 2, "pp": 1, "cp": 1}
    assert default_values("micro_batch_size", config) == [1, 2, 4, 8, 16, 32, 64]
    assert default_values("seq_len", config) == [512, 1024, 2048, 4096, 8192, 16384, 32768]
    assert default_values("num_gpus", config) == [2, 4, 8, 16, 32, 64, 128]
    assert default_values("zero", config) == [0, 1, 2, 3]
    assert default_values("recompute", config) == list(RECOMPUTE)  # every policy


@pytest.mark.parametrize("schema", [4, 3])
def test_points_best_per_cell(capsys, tmp_path, schema) -> None:
    """The best point of each cell; parts of schema 3 (String, Float64 bytes) draw the same."""
    sweep = [
        "sweep",
        "--model",
        "llama-3.2-1b",
        "--fleet",
        "8xa100-sxm-40gb",
        "--seq-len",
        "2048",
        "--global-batch-size",
        "32",
        "--max-pp",
        "2",
        "--max-cp",
        "1",
        "--max-micro-batch-size",
        "16",
        "--out",
        str(tmp_path / "sw"),
        "--json",
    ]
    _json(capsys, sweep)
    if schema == 3:
        from tests._points import rewrite_as_schema_3

        for part in (tmp_path / "sw" / "points").rglob("part-*.parquet"):
            rewrite_as_schema_3(part)
    out = tmp_path / "p.png"
    report = _json(
        capsys,
        [
            "heatmap",
            "--points",
            str(tmp_path / "sw"),
            "--where",
            "zero = 0",
            "--x",
            "micro_batch_size",
            "--y",
            "num_gpus",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert report["gpu"]["name"] == "a100-sxm-40gb" and report["model"] == "llama-3.2-1b"
    limit = report["limit_bytes"]
    points = pl.read_parquet(tmp_path / "sw" / "points", glob=True).filter(pl.col("zero") == 0)
    assert report["x_values"] == sorted(points["micro_batch_size"].unique().to_list())
    for cell in report["cells"]:
        here = points.filter(
            (pl.col("micro_batch_size") == cell["micro_batch_size"])
            & (pl.col("num_gpus") == cell["num_gpus"])
            & (pl.col("reason") == "")
        )
        fitting = here.filter(pl.col("peak_device_bytes") <= limit)
        pick = fitting if fitting.height else here
        assert cell["peak_device_bytes"] == pick["peak_device_bytes"].min()
        assert type(cell["peak_device_bytes"]) is int  # whole bytes, schema 3's rounded
        assert cell["fits"] is (fitting.height > 0)
        assert cell["zero"] == 0 and cell["num_points"] >= here.height
    assert any(c["fits"] for c in report["cells"]) and not all(c["fits"] for c in report["cells"])
    assert _png_size(out) == (1200, 760)
    # several GPUs need --where; a filter that keeps nothing is an error too
    assert (
        main(
            [
                "heatmap",
                "--points",
                str(tmp_path / "sw"),
                "--where",
                "zero = 9",
                "--out",
                str(tmp_path / "q.png"),
            ]
        )
        == 2
    )
    assert "no points" in capsys.readouterr().err and not (tmp_path / "q.png").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--x", "colour"], "--x: unknown axis 'colour'; allowed: micro_batch_size"),
        (["--x", "seq_len", "--y", "seq_len"], "both 'seq_len'"),
        (["--out", "{tmp}/h.jpg"], "--out: unknown extension"),
        (["--where", "zero = 3"], "--where: applies to --points"),
        (["--points", "{tmp}", "--where", "zero ="], "points"),
        (["--x-values", "1,two"], "not a whole number"),
        (["--x", "recompute", "--x-values", "none,sometimes"], "allowed: none, selective"),
        (["--precision", "fp9"], "precision: unknown value 'fp9'"),
        (["--headroom", "1"], "headroom"),
    ],
)
def test_bad_input_one_line_exit_2_nothing_written(capsys, tmp_path, argv, message) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    out = (
        []
        if any(a.startswith(str(tmp_path) + "/h.") for a in argv)
        else ["--out", str(tmp_path / "h.png")]
    )
    assert main(["heatmap", *argv, *out]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err
    assert not list(tmp_path.iterdir())
