"""The built-in defaults answer with a job that fits, and a result that fits nowhere says what
to change (issue 27 item 1: bare `estimate` printed DOES NOT FIT, margin -82.7 GiB; bare
`heatmap` drew an all-red picture; `fit` spent its advice lines on GPU swaps)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainmem.cli import main
from trainmem.report import JOB_DEFAULT_MODEL, JOB_DEFAULTS

DESIGN_EXAMPLE = {"num_gpus": 8, "zero": 3, "recompute": "full", "micro_batch_size": 4}
"""design.md's first example: a 13B model on 8 x H100, ZeRO-3, full recompute, micro-batch 4."""
NOT_FITTING = ["--model", "llama-3.1-8b", "--num-gpus", "1", "--zero", "0"]
NOT_FITTING += ["--recompute", "none", "--precision", "amp-bf16"]
"""The old defaults: Llama-3.1-8B full fine-tuning on one H100 80GB (153.98 GiB)."""


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_the_defaults_are_the_design_example() -> None:
    assert JOB_DEFAULT_MODEL == "llama-2-13b"
    assert {k: JOB_DEFAULTS[k] for k in DESIGN_EXAMPLE} == DESIGN_EXAMPLE
    assert JOB_DEFAULTS["precision"] == "mixed-bf16"


def test_bare_estimate_fits_with_the_default_headroom(capsys) -> None:
    report = json.loads(_run(["estimate", "--json"], capsys))
    assert report["model"] == "llama-2-13b" and report["gpu"]["name"] == "h100-sxm-80gb"
    assert {k: report["config"][k] for k in DESIGN_EXAMPLE} == DESIGN_EXAMPLE
    assert report["headroom"] == 0.10
    assert report["fits"] and report["headroom_bytes"] > 30 * 2**30  # margin +38.65 GiB
    text = _run(["estimate"], capsys)
    assert "FITS on h100-sxm-80gb" in text and "DOES NOT FIT" not in text


def test_bare_fit_and_compare_start_from_the_same_job(capsys) -> None:
    fit = json.loads(_run(["fit", "--json"], capsys))
    assert fit["fits"] and fit["max_micro_batch_size"] >= DESIGN_EXAMPLE["micro_batch_size"]
    assert fit["estimate"]["model"] == "llama-2-13b"
    out = _run(["compare", "--vs", "--zero 2"], capsys)
    assert out.splitlines()[:2] == ["a: llama-2-13b on 8 x h100-sxm-80gb", "b: zero 3 -> 2"]


def test_bare_heatmap_has_fitting_and_failing_cells(tmp_path: Path, capsys) -> None:
    out = tmp_path / "h.png"
    report = json.loads(_run(["heatmap", "--out", str(out), "--json"], capsys))
    fits = {c["fits"] for c in report["cells"]}
    assert fits == {True, False} and report["model"] == "llama-2-13b"
    assert "advice" not in report and "closest_cell" not in report
    assert out.stat().st_size > 0


def _legend_labels(fits: np.ndarray) -> list[str]:
    from matplotlib.figure import Figure

    from trainmem.results._plot import _colormap, _draw_legend

    fig = Figure()
    m = {"fits": fits, "valid": np.ones_like(fits), "present": np.ones_like(fits)}
    _draw_legend(fig, m, cmap=_colormap(), limit_label="fit boundary", outline=[])
    return [t.get_text() for t in fig.legends[0].get_texts()]


def test_the_legend_lists_only_what_the_picture_shows() -> None:
    pytest.importorskip("matplotlib")
    mixed = np.array([[True, False], [True, True]])
    assert _legend_labels(mixed) == ["fit boundary", "fits", "does not fit (\u2717)"]
    assert _legend_labels(np.zeros((2, 2), dtype=bool)) == ["does not fit (\u2717)"]
    assert _legend_labels(np.ones((2, 2), dtype=bool)) == ["fits"]


def test_an_all_red_heatmap_says_what_to_change(tmp_path: Path, capsys) -> None:
    argv = ["heatmap", *NOT_FITTING, "--x-values", "1,2", "--y-values", "1024,2048"]
    argv += ["--out", str(tmp_path / "h.png")]
    text = _run(argv, capsys)
    assert "0 fit" in text
    assert "nothing fits; the closest cell, micro_batch_size 1 x seq_len 1024, needs" in text
    assert "changes that make it fit (least slowdown first):" in text
    (gpus,) = [line for line in text.splitlines() if line.startswith("  it fits as it is on: ")]
    assert "b200-180gb (step time x" in gpus
    report = json.loads(_run([*argv, "--json"], capsys))
    assert report["closest_cell"]["micro_batch_size"] == 1
    assert report["closest_cell"]["seq_len"] == 1024
    assert any(a["fits"] and a["knob"] != "gpu" for a in report["advice"])


def test_fit_lists_memory_changes_first_and_gpus_on_one_line(capsys) -> None:
    """The stumble: five lines "gpu h100-sxm-80gb -> b200-180gb: saves 0.00 GiB, fits"."""
    lines = _run(["fit", *NOT_FITTING], capsys).splitlines()
    assert lines[0].startswith("nothing fits on h100-sxm-80gb: micro-batch 1 needs 153.98 GiB")
    assert lines[1] == "  changes that make it fit (least slowdown first):"
    changes = [line for line in lines if line.startswith("    ")]
    assert changes and not any("gpu " in line for line in changes)
    assert all("step time x" in line for line in changes)
    (gpus,) = [line for line in lines if line.startswith("  it fits as it is on: ")]
    assert gpus == lines[-1] and "b200-180gb (step time x" in gpus
    assert not any("saves 0.00 GiB" in line for line in lines)


def test_fit_and_estimate_say_the_same_changes(capsys) -> None:
    """fit's lines are estimate's, for the same (closest) job."""
    fit = _run(["fit", *NOT_FITTING], capsys).splitlines()[1:]
    est = _run(["estimate", *NOT_FITTING, "--micro-batch-size", "1"], capsys).splitlines()
    start = est.index(fit[0])
    assert est[start : start + len(fit)] == fit


def test_a_named_bf16_precision_on_a_gpu_without_bf16_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Left at its default, mixed-bf16 on a V100 runs as mixed-fp16 with a warning; named on
    the command line it is the user's choice, refused in one line (exit 2), not swapped."""
    job = ["estimate", "--model", "llama-2-7b", "--gpu", "v100-sxm2-32gb"]
    assert main([*job, "--precision", "mixed-bf16"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: precision: mixed-bf16 needs bf16 matmuls and gpu v100-sxm2-32gb has none "
        "(bf16_flops = 0); allowed on v100-sxm2-32gb: fp32, fp16, amp-fp16, mixed-fp16"
    ]
    assert main(job) == 0
    out = capsys.readouterr()
    assert "the default mixed-bf16 is estimated as mixed-fp16" in out.err
    assert "mixed-fp16" in out.out
