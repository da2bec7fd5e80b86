"""The stumbles of issue 27 (names and inputs), each run as written: `--gpu H100` and
`--fleet 8xH100` are the H100 (any case, every command and the Python API), and every value of
a heatmap axis is judged as its flag is (`--x-values 1,2,-3`: exit 2, one line, nothing
written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import trainmem
from trainmem.cli import main
from trainmem.sweep._heatmap import parse_values

JOB = ["--model", "gpt2", "--seq-len", "1024"]
SEARCH = ["--global-batch-size", "32", "--max-pp", "1", "--max-cp", "1"]
SEARCH += ["--max-micro-batch-size", "4"]


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("command", ["estimate", "fit"])
@pytest.mark.parametrize("gpu", ["H100", "h100", "H100-SXM-80GB"])
def test_gpu_in_any_case_is_the_profile(capsys, command: str, gpu: str) -> None:
    canonical = _json(capsys, [command, *JOB, "--gpu", "h100-sxm-80gb", "--json"])
    assert _json(capsys, [command, *JOB, "--gpu", gpu, "--json"]) == canonical


def test_an_unknown_gpu_is_one_line_naming_the_field_and_the_choices(capsys) -> None:
    err = _one_line_error(capsys, ["estimate", *JOB, "--gpu", "H10"])
    assert "unknown gpu 'H10'; did you mean 'h100'? allowed: a100-pcie-80gb," in err


def test_heatmap_gpu_in_any_case(capsys, tmp_path: Path) -> None:
    argv = ["heatmap", *JOB, "--x-values", "1,2", "--y-values", "512", "--json"]
    upper = _json(capsys, [*argv, "--gpu", "H100", "--out", str(tmp_path / "a.svg")])
    canonical = _json(capsys, [*argv, "--gpu", "h100-sxm-80gb", "--out", str(tmp_path / "b.svg")])
    assert upper["gpu"] == canonical["gpu"] and upper["cells"] == canonical["cells"]


@pytest.mark.parametrize("command", ["recommend", "sweep"])
def test_fleet_in_any_case(capsys, tmp_path: Path, command: str) -> None:
    def run(fleet: str, out: str) -> dict:
        extra = ["--out", str(tmp_path / out)] if command == "sweep" else []
        return _json(capsys, [command, *JOB, *SEARCH, "--fleet", fleet, *extra, "--json"])

    # the answers differ only where they name the fleet as given (its label, the study id)
    named = ("fleet", "study", "parquet", "elapsed_s")
    upper, canonical = run("8xH100", "a"), run("8xh100-sxm-80gb", "b")
    assert upper["fleet" if command == "recommend" else "study"].count("8xH100") == 1
    assert {k: v for k, v in upper.items() if k not in named} == {
        k: v for k, v in canonical.items() if k not in named
    }


def test_check_takes_gpu_and_fleet_in_any_case(capsys) -> None:
    files = {"ds.json": '{"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true}}'}
    by_flag = trainmem.check(files, model="llama-3.2-1b", gpu="H100")
    by_fleet = trainmem.check(files, model="llama-3.2-1b", fleet="8xH100")
    assert by_flag["gpu"]["name"] == by_fleet["gpu"]["name"] == "h100-sxm-80gb"
    assert by_fleet["config"]["num_gpus"] == 8


def test_python_api_in_any_case() -> None:
    assert trainmem.load_gpu("H100").name == "h100-sxm-80gb"
    upper = trainmem.estimate(model="gpt2", gpu="H100", seq_len=1024)
    assert upper == trainmem.estimate(model="gpt2", gpu="h100-sxm-80gb", seq_len=1024)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--x-values", "1,2,-3"], "--x-values: micro_batch_size must be in [1, 65536], got -3"),
        (["--x-values", "0"], "--x-values: micro_batch_size must be in [1, 65536], got 0"),
        (["--y-values", "512,-1"], "--y-values: seq_len must be in [1, 4194304], got -1"),
        (["--x", "tp", "--x-values", "1,0"], "--x-values: tp must be in [1, 1024], got 0"),
        (["--x", "pp", "--x-values", "-2"], "--x-values: pp must be in [1, 1024], got -2"),
        (["--x", "num_gpus", "--x-values", "0,8"], "--x-values: num_gpus must be in [1, "),
        (["--x", "zero", "--x-values", "0,4"], "--x-values: zero must be in [0, 3], got 4"),
        (["--x", "lora_rank", "--x-values", "-8"], "--x-values: lora_rank must be in [0, "),
        (["--x", "precision", "--x-values", "bf16,fp4"], "--x-values: unknown value 'fp4'"),
        (["--x", "offload", "--x-values", "sometimes"], "--x-values: unknown value 'sometimes'"),
    ],
)
def test_heatmap_axis_values_are_checked_like_their_flags(
    capsys, tmp_path: Path, argv: list[str], message: str
) -> None:
    err = _one_line_error(capsys, ["heatmap", *argv, "--out", str(tmp_path / "h.png")])
    assert message in err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("axis", "text", "message"),
    [
        ("dp", "1,0", "--x-values: dp must be >= 1, got 0"),
        ("grad_accum_steps", "-1", "--x-values: grad_accum_steps must be >= 1, got -1"),
        ("global_batch_size", "-4", "--x-values: global_batch_size must be in [0, "),
    ],
)
def test_stored_point_axes_are_checked_too(axis: str, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        parse_values("--x-values", axis, text)


def test_heatmap_values_within_bounds_still_draw(capsys, tmp_path: Path) -> None:
    out = tmp_path / "h.svg"
    argv = ["heatmap", *JOB, "--x", "zero", "--x-values", "0,3", "--y-values", "1,512"]
    report = _json(capsys, [*argv, "--out", str(out), "--json"])
    assert report["x_values"] == [0, 3] and report["y_values"] == [1, 512] and out.exists()
