"""Model presets (config.json-style files shipped in engine/presets/) and the model resolver."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from ._model import ModelSpec, model_from_hf_config

PRESET_DIR = Path(__file__).parent / "presets"


@functools.cache
def preset_names() -> tuple[str, ...]:
    """Names of the built-in presets, sorted."""
    return tuple(sorted(p.stem for p in PRESET_DIR.glob("*.json")))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"model: cannot read config {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"model: {path} is not a JSON object")
    return data


@functools.cache
def _load_cached(name_or_path: str) -> ModelSpec:
    path = Path(name_or_path)
    if name_or_path in preset_names():
        return model_from_hf_config(
            _read_json(PRESET_DIR / f"{name_or_path}.json"), name=name_or_path
        )
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.is_file():
        return model_from_hf_config(_read_json(path), name=os.fspath(name_or_path))
    raise ValueError(
        f"model: unknown model '{name_or_path}'; give a path to a Hugging Face config.json "
        f"or one of: {', '.join(preset_names())}"
    )


def load_model(name_or_path: str | os.PathLike[str]) -> ModelSpec:
    """A preset by name, or any Hugging Face config.json (file or folder) by local path."""
    return _load_cached(os.fspath(name_or_path))
