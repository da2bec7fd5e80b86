"""`fit` advises when nothing fits; `fit` and `sweep` use user model presets and optimizers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trainmem.catalog import model_config_dict
from trainmem.cli import main

ROOT = Path(__file__).resolve().parents[3]
OPTIMIZERS = ROOT / "tests" / "data" / "examples" / "optimizers"


def _json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(args) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_fit_gives_advice_when_nothing_fits(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(
        [
            "fit",
            "--model",
            "llama-3-8b",
            "--gpu",
            "h100-sxm-80gb",
            "--seq-len",
            "8192",
            "--precision",
            "amp-bf16",
            "--num-gpus",
            "1",
            "--zero",
            "0",
            "--recompute",
            "none",
            "--json",
        ],
        capsys,
    )
    assert out["fits"] is False and out["max_micro_batch_size"] is None
    assert any(entry["fits"] for entry in out["advice"])
    assert out["top_consumers"]


def test_fit_and_sweep_use_a_user_optimizer(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    base = ["--model", "llama-3.2-1b", "--optimizer", "adamw"]
    user = [
        "--model",
        "llama-3.2-1b",
        "--optimizers-dir",
        str(OPTIMIZERS),
        "--optimizer",
        "adam-mini",
    ]
    one_gpu = ["--num-gpus", "1", "--zero", "0", "--json"]  # unsharded states (not JOB_DEFAULTS)
    adamw = _json(["fit", *base, *one_gpu], capsys)["estimate"]["bytes"]["optimizer_states"]
    mini = _json(["fit", *user, *one_gpu], capsys)["estimate"]["bytes"]["optimizer_states"]
    assert mini < adamw
    swept = _json(["sweep", *user, "--json", "--out", str(tmp_path)], capsys)
    best, layout = swept["best"], swept["best"]["configuration"]
    # ZeRO-1+ shards the states over the data x context parallel ranks.
    shards = layout["dp"] * layout["cp"] if layout["zero"] >= 1 else 1
    assert best["breakdown"]["optimizer_states"] * shards == pytest.approx(mini, rel=1e-3)


def test_sweep_and_fit_use_a_user_model_preset(capsys, tmp_path) -> None:
    config = model_config_dict("llama-3.2-1b")
    config["num_hidden_layers"] = 8  # a smaller, custom model
    models = tmp_path / "models"
    models.mkdir()
    (models / "my-model.json").write_text(json.dumps(config))
    fit = _json(["fit", "--model", "my-model", "--models-dir", str(models), "--json"], capsys)
    assert fit["estimate"]["model"] == "my-model"
    swept = _json(
        [
            "sweep",
            "--model",
            "my-model",
            "--models-dir",
            str(models),
            "--json",
            "--out",
            str(tmp_path / "out"),
        ],
        capsys,
    )
    assert swept["num_points"] > 0
    shutil.rmtree(models)
