"""`trainmem explain` on the command line: the JSON contract (measured / predicted with
estimate's component names), estimate's flags and --config, --calibrate written atomically and
read back by --overhead-file (which then makes the prediction match), one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainmem.cli import main
from trainmem.engine import COMPONENTS

DATA = Path(__file__).resolve().parents[2] / "data"
SNAPSHOTS = DATA / "snapshots"
TINY = [
    *("--model", str(SNAPSHOTS / "tiny_llama.json"), "--num-gpus", "1", "--zero", "0"),
    *("--recompute", "none", "--precision", "amp-bf16", "--micro-batch-size", "2"),
    *("--seq-len", "64"),
]


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["explain", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_contract_keys_and_the_traced_example(capsys: pytest.CaptureFixture[str]) -> None:
    """The shipped traced snapshot against its own job: every measured component but the
    overheads within 1% of the prediction (the engine matches the tracer on this model)."""
    out = _json(capsys, str(SNAPSHOTS / "tiny_llama_amp.pickle"), *TINY)
    assert set(out["measured"]) == set(COMPONENTS) == set(out["predicted"])
    for c in ("parameters", "gradients", "optimizer_states", "activations"):
        assert out["measured"][c] == pytest.approx(out["predicted"][c], rel=0.01), c
    assert out["differs_most"] in COMPONENTS


def test_estimate_memory_viz_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """estimate --memory-viz writes the prediction as a snapshot; explain reads it back to the
    same components."""
    path = tmp_path / "predicted.pickle"
    assert main(["estimate", "--no-advice", "--memory-viz", str(path)]) == 0
    capsys.readouterr()
    out = _json(capsys, str(path))
    for c in ("parameters", "gradients", "optimizer_states", "activations", "transient"):
        assert out["measured"][c] == pytest.approx(out["predicted"][c], rel=1e-4), c  # 512 B blocks


def test_calibrate_then_overhead_file_matches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The calibrated fragmentation and context make the prediction match the OOM dump's."""
    toml = tmp_path / "cal.toml"
    flags = ["--num-gpus", "1", "--zero", "0"]
    first = _json(capsys, str(SNAPSHOTS / "oom.pickle"), *flags, "--calibrate", str(toml))
    assert first["calibration"]["cuda_context_bytes"] == 800 * 2**20  # make_torch_format.py's
    text = toml.read_text()
    assert "fragmentation_fraction = " in text and "cuda_context_bytes = 838860800" in text
    again = _json(capsys, str(SNAPSHOTS / "oom.pickle"), *flags, "--overhead-file", str(toml))
    measured, predicted = again["measured"], again["predicted"]
    assert predicted["fragmentation"] == pytest.approx(measured["fragmentation"], rel=1e-6)
    assert again["not_in_snapshot"]["cuda_context_bytes"] == 800 * 2**20
    # every command with --overhead takes the file
    assert main(["estimate", "--overhead-file", str(toml), "--no-advice", "--json"]) == 0
    assert main(["compare", "--overhead-file", str(toml), "--vs", "--zero 2", "--json"]) == 0


def test_config_file_job(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--config reads the job as `trainmem check` does (flags override it)."""
    config = tmp_path / "train.yaml"
    config.write_text(
        "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\n"
        "batch_size: 2\nmax_seq_len: 512\nenable_activation_checkpointing: true\n"
        "optimizer:\n  _component_: torch.optim.AdamW\n  lr: 2e-5\n"
        "device: cuda\ndtype: bf16\n"
    )
    out = _json(capsys, str(SNAPSHOTS / "linear_adamw.pickle"), "--config", str(config))
    assert out["config"]["micro_batch_size"] == 2 and out["config"]["recompute"] == "full"
    assert "llama" in out["model"].lower()
    flagged = _json(
        capsys,
        str(SNAPSHOTS / "linear_adamw.pickle"),
        "--config",
        str(config),
        "--micro-batch-size",
        "1",
    )
    assert flagged["config"]["micro_batch_size"] == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["missing.pickle"], "snapshot: missing.pickle: no such file"),
        ([str(DATA / "snapshots" / "tiny_llama.json")], "snapshot: "),
        ([str(SNAPSHOTS / "oom.pickle"), "--zero", "7"], "zero"),
        ([str(SNAPSHOTS / "oom.pickle"), "--overhead-file", "nope.toml"], "overhead_file"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cal.toml"
    assert main(["explain", *argv, "--calibrate", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not out.exists()


def test_human_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", str(SNAPSHOTS / "tiny_llama_amp.pickle"), *TINY]) == 0
    text = capsys.readouterr().out
    assert text.startswith("component") and "differs most:" in text and "(MiB)" in text
