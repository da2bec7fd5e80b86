"""`trainmem estimate --plot / --memory-viz` and `trainmem compare`: files written atomically,
estimate's own output unchanged by them, bad input a one-line error with exit code 2."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from trainmem.cli import main

JOB = ["--num-gpus", "8", "--zero", "3", "--recompute", "full", "--micro-batch-size", "4"]


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_plot_writes_the_picture_and_leaves_the_output_alone(
    tmp_path: Path, capsys, suffix
) -> None:
    pytest.importorskip("matplotlib")
    assert main(["estimate", *JOB, "--json"]) == 0
    plain = capsys.readouterr().out
    target = tmp_path / f"timeline.{suffix}"
    viz = tmp_path / "snapshot.pickle"
    args = ["estimate", *JOB, "--json", "--plot", str(target), "--memory-viz", str(viz)]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert captured.out == plain
    assert f"wrote {target}" in captured.err
    assert target.stat().st_size > 10_000
    assert target.read_bytes()[:4] == (b"\x89PNG" if suffix == "png" else b"<?xm")
    snapshot = pickle.loads(viz.read_bytes())
    assert set(snapshot) == {"segments", "device_traces"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


@pytest.mark.parametrize(
    ("flag", "name", "allowed"),
    [("--plot", "t.jpg", ".png, .svg"), ("--memory-viz", "t.json", ".pickle, .pkl")],
)
def test_bad_extension_is_one_line_exit_2(tmp_path: Path, capsys, flag, name, allowed) -> None:
    assert main(["estimate", flag, str(tmp_path / name)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"error: {flag}: ") and line.endswith(f"allowed: {allowed}")
    assert not list(tmp_path.iterdir())


EIGHT_GPU_JOB = ["--model", "llama-3.1-8b", "--num-gpus", "8", "--zero", "0", "--recompute", "none"]
"""8B on 8 GPUs without ZeRO or recompute (the one-job defaults, JOB_DEFAULTS, set both)."""


def test_compare_json_is_the_two_estimates_and_their_difference(capsys) -> None:
    assert main(["estimate", *EIGHT_GPU_JOB, "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert main(["estimate", *EIGHT_GPU_JOB, "--zero", "3", "--recompute", "full", "--json"]) == 0
    b = json.loads(capsys.readouterr().out)
    vs = ["--vs", "--zero 3 --recompute full", "--json"]
    assert main(["compare", *EIGHT_GPU_JOB, *vs]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["a"] == a and result["b"] == b
    assert result["changed"] == {"zero": [0, 3], "recompute": ["none", "full"]}
    d = result["difference"]
    assert d["peak_device_bytes"] == b["peak_device_bytes"] - a["peak_device_bytes"]
    for k, v in d["phases"].items():
        assert v == b["phases"][k] - a["phases"][k]
    for k, v in d["breakdown_at_peak"].items():
        assert v == b["breakdown_at_peak"][k] - a["breakdown_at_peak"][k]


def test_compare_table(capsys) -> None:
    assert main(["compare", *EIGHT_GPU_JOB, "--vs", "--zero 3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["a: llama-3.1-8b on 8 x h100-sxm-80gb", "b: zero 0 -> 3"]
    names = [line.split("  ")[0] for line in lines[3:]]
    assert names[:3] == ["parameters", "master weights", "gradients"]
    assert "peak backward" in names and "fits" in names


@pytest.mark.parametrize(
    ("vs", "message"),
    [
        (None, "error: vs: give the second configuration"),
        ("--zero 9", "error: vs: zero: must be in [0, 3], got 9"),
        ("--json", "error: vs: --json changes what is printed"),
        ("--bogus 1", "error: vs: No such option: --bogus"),
    ],
)
def test_compare_bad_vs_is_one_line_exit_2(capsys, vs, message) -> None:
    assert main(["compare", *([] if vs is None else ["--vs", vs])]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(message)
