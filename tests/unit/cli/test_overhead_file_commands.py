"""--overhead-file FILE.toml and --overhead KEY=VALUE on the planning commands (fit, sweep,
heatmap, recommend, trace; issue 28's "on every command"): each answers with the peaks
`estimate` gives for the same configuration and the same file, a flag given beside the file
wins, a bad file is one `error:` line with exit code 2 and nothing written, and a sweep under
other overheads never reuses the points of the old ones."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from trainmem.cli import main

CONTEXT_BYTES = 2_000_000_000
CALIBRATED = f"cuda_context_bytes = {CONTEXT_BYTES}\nfragmentation_fraction = 0.3\n"
"""What `trainmem explain --calibrate` writes (its keys), far from every GPU's defaults."""
OTHER = "fragmentation_fraction = 0.05\nnccl_bytes_per_communicator = 100000000\n"
"""A second calibration: only keys every pool keeps its own CUDA context and workspace under."""
SEARCH = [
    *("--model", "llama-3.2-1b", "--max-pp", "2", "--max-cp", "1"),
    *("--max-micro-batch-size", "4"),
]
"""A small search (about 7,000 points a pool)."""


@pytest.fixture
def calibrated(tmp_path: Path) -> Path:
    path = tmp_path / "cal.toml"
    path.write_text("# trainmem explain run.pickle --calibrate cal.toml\n" + CALIBRATED)
    return path


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _estimate_peak(capsys: pytest.CaptureFixture[str], *argv: str) -> int:
    return int(_json(capsys, "estimate", "--no-advice", *argv)["peak_device_bytes"])


def _point_flags(config: dict[str, Any]) -> list[str]:
    """estimate's flags of a point of SEARCH (the search's fixed fields: megatron, mixed-bf16,
    seq 4096, global batch 256, sequence parallelism on)."""
    flags = ["--model", "llama-3.2-1b", "--gpu", str(config["gpu"])]
    for key in ("num_gpus", "tp", "pp", "virtual_stages", "cp", "ep", "zero", "recompute"):
        flags += ["--" + key.replace("_", "-"), str(config[key])]
    flags += ["--offload", str(config["offload"])]
    flags += ["--micro-batch-size", str(config["micro_batch_size"])]
    return [
        *flags,
        *("--seq-len", "4096", "--global-batch-size", "256", "--framework", "megatron"),
        *("--precision", "mixed-bf16", "--sequence-parallel"),
    ]


def test_fit_answers_with_the_files_overheads(
    capsys: pytest.CaptureFixture[str], calibrated: Path
) -> None:
    plain = _json(capsys, "fit")
    got = _json(capsys, "fit", "--overhead-file", str(calibrated))
    mb = got["max_micro_batch_size"]
    assert mb < plain["max_micro_batch_size"]  # 2 GB of context and 30% fragmentation
    peak = _estimate_peak(capsys, "--micro-batch-size", str(mb), "--overhead-file", str(calibrated))
    assert got["estimate"]["peak_device_bytes"] == peak
    # a flag beside the file wins: the file's context replaced, its fragmentation kept
    flag = ["--overhead-file", str(calibrated), "--overhead", "cuda_context_bytes=1e9"]
    both = _json(capsys, "fit", *flag, "--minimize", "num-gpus")
    n = str(both["min_num_gpus"])
    assert both["estimate"]["peak_device_bytes"] == _estimate_peak(capsys, *flag, "--num-gpus", n)
    assert both["estimate"]["peak_device_bytes"] != _estimate_peak(
        capsys, "--overhead-file", str(calibrated), "--num-gpus", n
    )


def test_heatmap_cells_are_estimates_with_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], calibrated: Path
) -> None:
    out = tmp_path / "map.png"
    flags = ["--x-values", "1,8", "--y-values", "1024,4096", "--out", str(out)]
    got = _json(capsys, "heatmap", *flags, "--overhead-file", str(calibrated))
    assert out.is_file()
    for cell in got["cells"]:
        peak = _estimate_peak(
            capsys,
            *("--micro-batch-size", str(cell["micro_batch_size"])),
            *("--seq-len", str(cell["seq_len"]), "--overhead-file", str(calibrated)),
        )
        assert cell["peak_device_bytes"] == peak


def test_sweep_points_are_estimates_with_the_file_on_every_pool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two GPU types: the file's keys replace each pool's own, the others stay each GPU's
    (the A100's cuBLAS workspace is not the H100's)."""
    from trainmem.results import query_points

    other = tmp_path / "other.toml"
    other.write_text(OTHER)
    fleet = "8xh100-sxm-80gb,8xa100-sxm-80gb"
    got = _json(
        capsys, "sweep", *SEARCH, "--fleet", fleet, "--out", str(tmp_path / "o"),
        "--overhead-file", str(other),
    )  # fmt: skip
    best = got["best"]
    assert best["peak_device_bytes"] == _estimate_peak(
        capsys, *_point_flags(best["configuration"]), "--overhead-file", str(other)
    )
    for gpu in ("h100-sxm-80gb", "a100-sxm-80gb"):
        where = f"gpu = '{gpu}' AND fits AND num_gpus = 8 AND tp = 2"
        row = query_points(got["parquet"], where=where, head=1).to_dicts()[0]
        assert row["peak_device_bytes"] == _estimate_peak(
            capsys, *_point_flags(row), "--overhead-file", str(other)
        ), gpu


def test_recommend_plan_and_its_reproduce_line(
    capsys: pytest.CaptureFixture[str], calibrated: Path
) -> None:
    flags = ["--overhead-file", str(calibrated), "--overhead", "fragmentation_fraction=0.25"]
    plain = _json(capsys, "recommend", *SEARCH)
    got = _json(capsys, "recommend", *SEARCH, *flags)
    assert got["fits"] and got["peak_device_bytes"] != plain["peak_device_bytes"]
    line = shlex.split(got["estimate_command"])
    assert line[-4:] == flags  # the reproduce line carries them, the flag after the file
    assert got["peak_device_bytes"] == _estimate_peak(capsys, *line[2:])
    for alternative in got["alternatives"][:2]:
        again = shlex.split(alternative["estimate_command"])[2:]
        assert alternative["peak_device_bytes"] == _estimate_peak(capsys, *again)


def test_trace_estimate_takes_the_file(
    capsys: pytest.CaptureFixture[str], calibrated: Path
) -> None:
    """trace's estimate beside the trace (a tiny model, on fake tensors)."""
    pytest.importorskip("torch")
    tiny = Path(__file__).resolve().parents[2] / "data" / "snapshots" / "tiny_llama.json"
    job = ["--model", str(tiny), "--seq-len", "64"]
    got = _json(capsys, "trace", *job, "--overhead-file", str(calibrated))
    same = ["--num-gpus", "1", "--zero", "0", "--recompute", "none", "--precision", "bf16"]
    peak = _estimate_peak(
        capsys, *job, *same, "--micro-batch-size", "1", "--framework", "hf",
        "--overhead-file", str(calibrated),
    )  # fmt: skip
    assert got["estimate"]["peak_device_bytes"] == peak
    assert got["estimate_report"]["peak_device_bytes"] == peak


BAD_FILES = {
    "unknown key": ("bogus = 1\n", "unknown key 'bogus'"),
    "not TOML": ("cuda_context_bytes = = 1\n", "not TOML"),
    "not a number": ('cuda_context_bytes = "big"\n', "must be a number"),
    "out of range": ("fragmentation_fraction = 1.5\n", "fragmentation_fraction"),
}


@pytest.mark.parametrize("command", ["fit", "sweep", "heatmap", "recommend", "trace"])
@pytest.mark.parametrize("bad", sorted(BAD_FILES))
def test_a_bad_file_is_one_line_and_nothing_written(
    command: str,
    bad: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text, said = BAD_FILES[bad]
    path = tmp_path / "bad.toml"
    path.write_text(text)
    monkeypatch.chdir(tmp_path)
    extra = {"sweep": ["--out", "points"], "heatmap": ["--out", "map.png"]}.get(command, [])
    capsys.readouterr()
    assert main([command, *extra, "--overhead-file", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: overhead_file: ") and said in err and "\n" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml"]  # nothing written


@pytest.mark.parametrize("command", ["fit", "sweep", "heatmap", "recommend"])
def test_a_missing_file_and_a_bad_flag(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = {"sweep": ["--out", str(tmp_path / "o")], "heatmap": ["--out", str(tmp_path / "m.png")]}
    extra = out.get(command, [])
    capsys.readouterr()
    assert main([command, *extra, "--overhead-file", str(tmp_path / "nope.toml")]) == 2
    assert "overhead_file" in capsys.readouterr().err
    assert main([command, *extra, "--overhead", "cuda_context_bytes=1e12"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: overhead: cuda_context_bytes") and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_heatmap_of_stored_points_refuses_overheads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], calibrated: Path
) -> None:
    capsys.readouterr()
    argv = ["heatmap", "--points", str(tmp_path), "--overhead-file", str(calibrated)]
    assert main([*argv, "--out", str(tmp_path / "m.png")]) == 2
    assert "error: --overhead/--overhead-file: with --points" in capsys.readouterr().err


def test_a_resumed_sweep_under_other_overheads_reuses_no_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], calibrated: Path
) -> None:
    """The overheads are in the default study name and in the space's fingerprint (the part
    names): a rerun with another file is another study, and even under one --study-name its
    chunks are evaluated again; the same file again resumes."""
    out = ["--fleet", "8xh100-sxm-80gb", "--out", str(tmp_path / "o")]
    other = tmp_path / "other.toml"
    other.write_text(OTHER)
    plain = _json(capsys, "sweep", *SEARCH, *out)
    first = _json(capsys, "sweep", *SEARCH, *out, "--overhead-file", str(calibrated))
    second = _json(capsys, "sweep", *SEARCH, *out, "--overhead-file", str(other))
    assert len({plain["study"], first["study"], second["study"]}) == 3
    assert "-ov" not in plain["study"]  # no overheads: the name it always had
    assert first["chunks_skipped"] == second["chunks_skipped"] == 0
    again = _json(capsys, "sweep", *SEARCH, *out, "--overhead-file", str(calibrated))
    assert again["study"] == first["study"] and again["chunks_skipped"] > 0
    assert again["best"] == first["best"]
    named = [*SEARCH, *out, "--study-name", "one"]
    _json(capsys, "sweep", *named, "--overhead-file", str(calibrated))
    mixed = _json(capsys, "sweep", *named, "--overhead-file", str(other))
    assert mixed["chunks_skipped"] == 0
    assert mixed["best"] == second["best"]
    flag = _json(capsys, "sweep", *named, "--overhead", "fragmentation_fraction=0.05")
    assert flag["chunks_skipped"] == 0  # one key fewer than the file: other overheads


def test_an_optuna_study_under_overheads_is_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], calibrated: Path
) -> None:
    """Optuna's trials are evaluated with the file (its best point is estimate's with the
    file), in a study of its own name (never rebuilt from points of other overheads)."""
    argv = [*SEARCH, "--method", "optuna", "--trials", "10", "--out", str(tmp_path / "o")]
    got = _json(capsys, "sweep", *argv, "--overhead-file", str(calibrated))
    assert got["study"].endswith("-optuna-" + got["study"].rsplit("-", 1)[1])
    assert got["study"].rsplit("-", 1)[1].startswith("ov")
    best = got["best"]
    assert best["peak_device_bytes"] == _estimate_peak(
        capsys, *_point_flags(best["configuration"]), "--overhead-file", str(calibrated)
    )
