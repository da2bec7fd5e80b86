"""The shipped T5 profiles (catalog/profiles/t5-*.json, traced from
tests/data/trace_modules/t5.py) drive estimate and sweep; no torch needed.
tests/unit/trace/test_t5_profile.py checks them against direct traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainmem.cli import main

PROFILES = Path(__file__).resolve().parents[3] / "catalog" / "profiles"
# PyTorch's counts of the factories' models (the published checkpoints' sizes).
PARAMETERS = {
    "t5-v1_1-base-amp-bf16.json": 247_577_856,
    "t5-v1_1-base-amp-bf16-recompute-full.json": 247_577_856,
    "t5-base-amp-bf16.json": 222_903_552,
}


def _json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(args) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", sorted(PARAMETERS))
def test_a_t5_profile_drives_an_estimate(name: str, capsys) -> None:
    profile = json.loads((PROFILES / name).read_text())
    assert profile["num_layers"] == 24 and profile["layer_class"] == "T5Block"
    assert profile["parameters"]["trainable"] == PARAMETERS[name]
    # by its shipped name, as a user without the repository passes it
    args = ["estimate", "--profile", name.removesuffix(".json"), "--seq-len", "512", "--json"]
    out = _json([*args, "--micro-batch-size", "8"], capsys)
    assert out["num_parameters"] == PARAMETERS[name] and out["fits"]
    assert out["config"]["recompute"] == profile["valid_for"]["recompute"]
    half = _json([*args, "--micro-batch-size", "4"], capsys)
    assert 0 < half["bytes"]["activations"] < out["bytes"]["activations"]


def test_the_t5_profile_drives_a_sweep(capsys, tmp_path: Path) -> None:
    out = _json(
        [
            "sweep",
            "--profile",
            str(PROFILES / "t5-v1_1-base-amp-bf16.json"),
            "--fleet",
            "8xh100-sxm-80gb",
            "--seq-len",
            "512",
            "--global-batch-size",
            "256",
            "--out",
            str(tmp_path),
            "--json",
        ],
        capsys,
    )
    best = out["best"]
    assert out["num_points"] > 0 and best["fits"]
    assert best["configuration"]["tp"] == 1 and best["configuration"]["cp"] == 1
