"""Hostile inputs of issue 31, every command: endless or blocking files, names longer than the
file system allows, integers past what a C conversion holds, fleets past the pool caps, `serve`
options, and fit's exit code for a layout that is invalid in itself. Each is one line
`error: ...` naming the input, exit 2, no traceback, nothing written.

Cases that could hang or swamp memory on a regression (a FIFO, /dev/zero) run the CLI in a child
process with a timeout and an address-space cap; the rest call main() in-process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from trainmem.cli import main

LONG = "n" * 300
"""A name longer than any file system's NAME_MAX (255 on Linux, macOS)."""


def _one_error_line(capsys: pytest.CaptureFixture[str], code: int, names: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err[-500:]
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-500:]
    assert "Traceback" not in err
    assert names.lower() in lines[0].lower(), lines[0]
    return lines[0]


def _snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# ---- names longer than the file system allows ---------------------------------------------------

LONG_NAME_CASES = {
    "estimate-model": (["estimate", "--model", "{L}"], "model"),
    "estimate-model-folder": (["estimate", "--model", "{L}/config.json"], "model"),
    "fit-model": (["fit", "--model", "{L}"], "model"),
    "gpus-hardware-dir": (["gpus", "--hardware-dir", "{L}"], "hardware dir"),
    "estimate-hardware-dir": (["estimate", "--hardware-dir", "{L}"], "hardware dir"),
    "models-models-dir": (["models", "--models-dir", "{L}"], "models dir"),
    "fit-models-dir": (["fit", "--models-dir", "{L}"], "models dir"),
    "optimizers-dir": (["optimizers", "--optimizers-dir", "{L}"], "optimizers dir"),
    "points-path": (["points", "{L}"], "points"),
    "heatmap-out": (["heatmap", "--out", "{L}.png"], "--out"),
    "heatmap-points": (["heatmap", "--points", "{L}", "--out", "{TMP}/o.png"], "points"),
    "sweep-out": (["sweep", "--out", "{L}"], "out"),
    "estimate-plot": (["estimate", "--plot", "{L}.png"], "--plot"),
    "estimate-memory-viz": (["estimate", "--memory-viz", "{L}.pickle"], "--memory-viz"),
    "estimate-profile": (["estimate", "--profile", "{L}.json"], "profile"),
    "recommend-fleet": (["recommend", "--fleet", "{L}.toml"], "fleet"),
    "check-file": (["check", "{L}.yaml"], "file name too long"),
}


@pytest.mark.parametrize(
    ("argv", "names"), list(LONG_NAME_CASES.values()), ids=list(LONG_NAME_CASES)
)
def test_a_name_too_long_is_one_line(capsys, tmp_path: Path, argv, names) -> None:
    long_path = str(tmp_path / LONG)
    before = _snapshot(tmp_path)
    code = main([a.replace("{L}", long_path).replace("{TMP}", str(tmp_path)) for a in argv])
    line = _one_error_line(capsys, code, names)
    assert "too long" in line, line
    assert len(line) < 400, "the long name is shortened"
    assert _snapshot(tmp_path) == before


def test_a_name_too_long_anywhere_else_is_still_one_line(capsys, monkeypatch) -> None:
    """main()'s net: an ENAMETOOLONG no check caught up front is one line, exit 2."""
    import errno

    import trainmem.cli._app as app_module

    def too_long(**_: object) -> None:
        raise OSError(errno.ENAMETOOLONG, "File name too long", "x" * 400)

    monkeypatch.setattr(app_module, "app", too_long)
    line = _one_error_line(capsys, main(["estimate"]), "file name too long")
    assert "..." in line


# ---- endless, blocking and oversized files ------------------------------------------------------

_GPU = (Path(__file__).parents[2] / "hardware" / "gpus" / "h100-sxm-80gb.toml").read_text()


def _hostile(tmp_path: Path, kind: str, name: str) -> Path:
    """A file called `name` in its own folder: a FIFO, /dev/zero, or 17 MiB of comment."""
    folder = tmp_path / kind
    folder.mkdir(exist_ok=True)
    path = folder / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    else:
        path.write_bytes(b"#" * (17 << 20))
    return path


FILE_CASES = {
    "gpus-hardware-dir": (["gpus", "--hardware-dir", "{DIR}"], "x.toml"),
    "models-models-dir": (["models", "--models-dir", "{DIR}"], "x.json"),
    "optimizers-dir": (["optimizers", "--optimizers-dir", "{DIR}"], "x.toml"),
    "recommend-fleet": (["recommend", "--fleet", "{FILE}"], "fleet.toml"),
    "estimate-profile": (["estimate", "--profile", "{FILE}"], "p.json"),
    "estimate-model-folder": (["estimate", "--model", "{DIR}"], "config.json"),
    "check": (["check", "{FILE}"], "train.yaml"),
    "points": (["points", "{DIR}"], "part-0.parquet"),
}


def _run_cli(argv: list[str]) -> subprocess.CompletedProcess[str]:
    guard = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
        "from trainmem.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    return subprocess.run(
        [sys.executable, "-c", guard, *argv], capture_output=True, text=True, timeout=120
    )


def _case_argv(argv: list[str], path: Path) -> list[str]:
    return [a.replace("{DIR}", str(path.parent)).replace("{FILE}", str(path)) for a in argv]


@pytest.mark.parametrize("kind", ["fifo", "zero"])
@pytest.mark.parametrize(("argv", "name"), list(FILE_CASES.values()), ids=list(FILE_CASES))
def test_endless_or_blocking_files_are_one_line(tmp_path: Path, argv, name, kind) -> None:
    result = _run_cli(_case_argv(argv, _hostile(tmp_path, kind, name)))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-800:]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-800:]
    if name == "config.json":  # no regular config.json in the folder: not a model folder
        assert "unknown model" in lines[0], lines[0]
    else:
        assert "not a regular file" in lines[0] and name in lines[0], lines[0]


@pytest.mark.parametrize(
    ("argv", "name"),
    [v for k, v in FILE_CASES.items() if k != "points"],  # a part is Parquet, of any size
    ids=[k for k in FILE_CASES if k != "points"],
)
def test_files_past_the_cap_are_one_line(capsys, tmp_path: Path, argv, name) -> None:
    path = _hostile(tmp_path, "large", name)
    line = _one_error_line(capsys, main(_case_argv(argv, path)), name)
    assert "larger than" in line and "MiB" in line, line


# ---- integers past a C conversion, fleets past the caps ----------------------------------------

_POOL = '[[pool]]\ngpu = "h100-sxm-80gb"\nnodes = {nodes}\n'

INTEGER_CASES = {
    "fleet-nodes-2^63-1": ("toml", _POOL.format(nodes=2**63 - 1), "at most 1,000,000 GPUs"),
    "fleet-gpus-per-node": (
        "toml",
        _POOL.format(nodes=1) + "gpus_per_node = 1000000\n",
        "gpus_per_node must be <= 1024",
    ),
    "fleet-host-memory": (
        "toml",
        _POOL.format(nodes=1) + "host_memory_gib = 1e300\n",
        "host_memory_gib",
    ),
    "fleet-1000-pools": ("toml", _POOL.format(nodes=1) * 1000, "at most 64 pools"),
    "shorthand-2^40": ("text", f"{2**40}xh100", "COUNT must be <= 1,000,000"),
    "shorthand-65-pools": ("text", ",".join(["8xh100"] * 65), "at most 64 pools"),
}


@pytest.mark.parametrize("command", ["recommend", "sweep"])
@pytest.mark.parametrize(
    ("form", "fleet", "names"), list(INTEGER_CASES.values()), ids=list(INTEGER_CASES)
)
def test_fleets_past_the_caps_are_one_line(capsys, tmp_path, command, form, fleet, names) -> None:
    if form == "toml":
        (tmp_path / "fleet.toml").write_text(fleet)
        fleet = str(tmp_path / "fleet.toml")
    extra = ["--out", str(tmp_path / "out")] if command == "sweep" else []
    before = _snapshot(tmp_path)
    _one_error_line(capsys, main([command, "--fleet", fleet, *extra]), names)
    assert _snapshot(tmp_path) == before


def test_the_pool_caps_are_the_services(tmp_path) -> None:
    """One cap for the CLI, the Python API and HTTP (serve/_fleet.py imports them)."""
    from trainmem.hardware import _fleet
    from trainmem.serve import _fleet as http_fleet

    assert (http_fleet.MAX_POOLS, http_fleet.MAX_POOL_GPUS, http_fleet.MAX_GPUS_PER_NODE) == (
        _fleet.MAX_POOLS,
        _fleet.MAX_POOL_GPUS,
        _fleet.MAX_GPUS_PER_NODE,
    )


@pytest.fixture(scope="module")
def points(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("points")
    argv = ["sweep", "--model", "llama-3.2-1b", "--fleet", "8xa100-sxm-40gb", "--max-pp", "2"]
    assert main([*argv, "--max-cp", "1", "--out", str(root), "--json"]) == 0
    return root


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        (["--head", str(2**63)], "--head"),
        (["--head", str(2**63 - 1)], "--head"),
        (["--head", str(2**32)], "--head"),
        (["--where", "num_gpus * 4611686018427387904 > 0"], "2^53"),
        (["--where", f"num_gpus > {'9' * 5000}"], "5000 digits"),
    ],
)
def test_points_integers_past_int64_are_one_line(capsys, points, extra, names) -> None:
    _one_error_line(capsys, main(["points", str(points), *extra]), names)


def test_points_decimals_compute_in_floating_point(capsys, points) -> None:
    assert main(["points", str(points), "--where", "num_gpus * 4.6e18 > 0", "--head", "1"]) == 0
    assert main(["points", str(points), "--where", "num_gpus * 9007199254740992 > 0"]) == 0


def test_a_fifo_part_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "part-0.parquet")
    result = _run_cli(["points", str(tmp_path)])
    assert result.returncode == 2 and "not a regular file" in result.stderr, result.stderr[-500:]


# ---- serve's options, before uvicorn starts -----------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--host", "no.such.host.invalid"], "host"),
        (["--max-concurrent", "100000"], "max_concurrent"),
        (["--max-concurrent", "0"], "max_concurrent"),
        (["--port", "70000"], "port"),
        (["--port", "0"], "port"),
        (["--timeout-s", "nan"], "timeout_s"),
        (["--timeout-s", "inf"], "timeout_s"),
        (["--timeout-s", "0"], "timeout_s"),
        (["--max-body-bytes", str(1 << 40)], "max_body_bytes"),
        (["--max-points", str(10**12)], "max_points"),
        (["--max-grid-rows", str(1 << 30)], "max_grid_rows"),
    ],
)
def test_serve_options_are_checked_before_anything_is_printed(capsys, argv, names) -> None:
    line = _one_error_line(capsys, main(["serve", *argv]), names)
    assert "reachable beyond" not in line


def test_serve_refuses_a_taken_port(capsys) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        _one_error_line(capsys, main(["serve", "--port", str(port)]), f"{port}")


def test_serve_limits_bound_the_python_api_too() -> None:
    from trainmem.serve import Limits

    with pytest.raises(ValueError, match="max_concurrent: must be in"):
        Limits(max_concurrent=100_000)
    assert Limits(timeout_s=1e-4).timeout_s == 1e-4


# ---- fit: an invalid layout is bad input (2), as in estimate -----------------------------------

INVALID_LAYOUTS = {
    "tp-not-dividing-heads": ["--tp", "3", "--num-gpus", "3"],
    "ep-not-dividing-experts": ["--model", "mixtral-8x7b", "--ep", "3", "--num-gpus", "3"],
    "pp-above-layers": ["--model", "gpt2", "--seq-len", "1024", "--pp", "13", "--num-gpus", "13"],
    "global-batch-below-dp": ["--num-gpus", "8", "--global-batch-size", "4"],
    "gpus-not-a-multiple": ["--tp", "2", "--num-gpus", "3"],
}


@pytest.mark.parametrize("argv", list(INVALID_LAYOUTS.values()), ids=list(INVALID_LAYOUTS))
@pytest.mark.parametrize("check", [[], ["--check"]], ids=["plain", "check"])
def test_fit_says_estimates_layout_error_with_exit_2(capsys, argv, check) -> None:
    code = main(["estimate", *argv])
    expected = _one_error_line(capsys, code, "layout: ")
    assert main(["fit", *argv, *check]) == 2
    assert capsys.readouterr().err.strip() == expected


@pytest.mark.parametrize(
    "argv",
    [
        ["--tp", "3"],
        ["--model", "gpt2", "--seq-len", "1024", "--pp", "5"],
        ["--model", "mixtral-8x7b", "--ep", "3"],
    ],
)
def test_fit_minimize_num_gpus_refuses_an_invalid_layout(capsys, argv) -> None:
    for check in ([], ["--check"]):
        line = _one_error_line(capsys, main(["fit", "--minimize", "num-gpus", *argv, *check]), "")
        assert line.startswith("error: layout: "), line


def test_fit_a_search_space_too_small_stays_nothing_fits(capsys) -> None:
    """ep 64 needs dp a multiple of 64: no GPU count up to 32 is a valid layout, but the job's
    layout is not invalid in itself (64 GPUs would do): exit 1 with --check, the reason said."""
    argv = ["fit", "--minimize", "num-gpus", "--model", "deepseek-v2-lite", "--ep", "64"]
    assert main([*argv, "--max-num-gpus", "32", "--check", "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["min_num_gpus"] is None and "ep must divide" in result["reason"]
    assert main([*argv, "--max-num-gpus", "32", "--json"]) == 0
