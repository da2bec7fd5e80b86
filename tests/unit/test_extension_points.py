"""Contributions as data: every shipped data file validates; user presets and optimizers work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainmem.catalog import (
    load_model,
    load_optimizers,
    model_presets,
    optimizer_columns,
    read_optimizer_file,
)
from trainmem.cli import main
from trainmem.engine import model_from_hf_config
from trainmem.hardware._loader import _read_file

ROOT = Path(__file__).resolve().parents[2]
PRESETS = sorted((ROOT / "catalog" / "presets").glob("*.json"))
GPUS = sorted((ROOT / "hardware" / "gpus").glob("*.toml"))
EXAMPLE_OPTIMIZERS = sorted((ROOT / "tests" / "data" / "examples" / "optimizers").glob("*.toml"))


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any] | list[Any]:
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_every_shipped_model_preset_validates(path: Path) -> None:
    model = model_from_hf_config(json.loads(path.read_text()), name=path.stem)
    assert model.num_parameters > 0


@pytest.mark.parametrize("path", GPUS, ids=lambda p: p.name)
def test_every_shipped_gpu_profile_validates(path: Path) -> None:
    assert _read_file(path).name == path.stem


@pytest.mark.parametrize("path", EXAMPLE_OPTIMIZERS, ids=lambda p: p.name)
def test_every_shipped_optimizer_file_validates(path: Path) -> None:
    assert read_optimizer_file(str(path)).name == path.stem


def test_shipped_data_exists() -> None:
    assert len(PRESETS) >= 30 and len(GPUS) >= 10 and EXAMPLE_OPTIMIZERS


@pytest.fixture()
def models_dir(tmp_path: Path) -> Path:
    config = json.loads((ROOT / "catalog" / "presets" / "llama-3-8b.json").read_text())
    config["num_hidden_layers"] = 8
    (tmp_path / "my-llama-8l.json").write_text(json.dumps(config))
    return tmp_path


def test_user_model_preset_is_used_by_estimate(
    models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = model_from_hf_config(
        json.loads((models_dir / "my-llama-8l.json").read_text()), name="my-llama-8l"
    ).num_parameters
    out = _run(
        ["estimate", "--models-dir", str(models_dir), "--model", "my-llama-8l", "--json"], capsys
    )
    assert isinstance(out, dict)
    assert out["model"] == "my-llama-8l" and out["num_parameters"] == expected
    full = load_model("llama-3-8b").num_parameters
    assert expected < full


def test_user_model_preset_from_the_environment(
    models_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINMEM_MODELS_DIR", str(models_dir))
    out = _run(["estimate", "--model", "my-llama-8l", "--json"], capsys)
    assert isinstance(out, dict) and out["model"] == "my-llama-8l"
    listing = _run(["models", "--json"], capsys)
    assert isinstance(listing, list)
    sources = {r["name"]: r["source"] for r in listing}
    assert sources["my-llama-8l"] == str(models_dir / "my-llama-8l.json")
    assert sources["llama-3-8b"] == "built-in"


def test_a_user_preset_overrides_a_builtin_of_the_same_name(models_dir: Path) -> None:
    (models_dir / "my-llama-8l.json").rename(models_dir / "llama-3-8b.json")
    assert model_presets(models_dir)["llama-3-8b"] == str(models_dir / "llama-3-8b.json")
    assert load_model("llama-3-8b", models_dir=models_dir).num_hidden_layers == 8
    assert load_model("llama-3-8b").num_hidden_layers == 32


ADAMW_CLONE = """name = "my-adamw"
num_states = 2
state_bytes = 0
step_temp_states = 1
eight_bit_blockwise = false
step_bytes_per_parameter = 28
"""


def test_user_optimizer_equal_to_adamw_gives_adamw_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "my-adamw.toml").write_text(ADAMW_CLONE)
    job = [
        "estimate",
        "--model",
        "llama-3.2-1b",
        "--num-gpus",
        "8",
        "--zero",
        "1",
        "--precision",
        "mixed-bf16",
        "--json",
    ]
    base = _run([*job, "--optimizer", "adamw"], capsys)
    user = _run([*job, "--optimizers-dir", str(tmp_path), "--optimizer", "my-adamw"], capsys)
    assert isinstance(base, dict) and isinstance(user, dict)
    assert user["config"]["optimizer"] == "my-adamw"
    assert user["bytes"] == base["bytes"]
    assert user["peak_device_bytes"] == base["peak_device_bytes"]
    assert user["time"]["step_time_s"] == base["time"]["step_time_s"]


def test_user_optimizer_states_scale_with_its_state_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "one-state.toml").write_text(
        ADAMW_CLONE.replace("my-adamw", "one-state").replace("num_states = 2", "num_states = 1")
    )
    job = ["estimate", "--model", "llama-3.2-1b", "--json", "--optimizers-dir", str(tmp_path)]
    adamw = _run([*job, "--optimizer", "adamw"], capsys)
    one = _run([*job, "--optimizer", "one-state"], capsys)
    assert isinstance(adamw, dict) and isinstance(one, dict)
    assert one["bytes"]["optimizer_states"] * 2 == adamw["bytes"]["optimizer_states"]
    assert any("one-state, 1 fp32 state per parameter" in c["what"] for c in one["top_consumers"])


def test_user_optimizer_file_errors_name_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "broken.toml").write_text('name = "broken"\nnum_states = 1\n')
    assert main(["optimizers", "--optimizers-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "broken.toml" in err and "missing keys" in err
    (tmp_path / "broken.toml").write_text(ADAMW_CLONE.replace("my-adamw", "adamw"))
    (tmp_path / "broken.toml").rename(tmp_path / "adamw.toml")
    with pytest.raises(ValueError, match="built-in"):
        load_optimizers(tmp_path)


def test_optimizers_listing_shows_builtins_and_user_files(
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = str(ROOT / "tests" / "data" / "examples" / "optimizers")
    rows = _run(["optimizers", "--json", "--optimizers-dir", folder], capsys)
    assert isinstance(rows, list)
    sources = {r["name"]: r["source"] for r in rows}
    assert sources["adamw"] == "built-in" and sources["lion"] == "built-in"
    assert sources["adam-mini"].endswith("tests/data/examples/optimizers/adam-mini.toml")


def test_unknown_model_suggests_the_closest_preset() -> None:
    with pytest.raises(
        ValueError, match=r"unknown model 'llama-3.1-8'; did you mean 'llama-3.1-8b'\? "
    ):
        load_model("llama-3.1-8")


def test_unknown_optimizer_suggests_the_closest_name() -> None:
    with pytest.raises(
        ValueError, match=r"^optimizer: unknown value 'adamw8'; did you mean 'adamw'\? allowed: "
    ):
        optimizer_columns("adamw8")
