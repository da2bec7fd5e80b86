"""Model presets (config.json-style files shipped in catalog/presets/, and a user folder on top)
and the model resolver."""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trainmem.engine import ModelSpec, model_from_hf_config
from trainmem.hardware._files import check_path_name, read_input_text

PRESET_DIR = Path(__file__).parent / "presets"
ENV_VAR = "TRAINMEM_MODELS_DIR"
"""Environment variable naming a folder of extra or overriding ``<name>.json`` model presets."""
BUILTIN = "built-in"


@functools.cache
def preset_names() -> tuple[str, ...]:
    """Names of the built-in presets, sorted."""
    return tuple(sorted(p.stem for p in PRESET_DIR.glob("*.json")))


HUB_SOURCE = re.compile(r"\s*([\w.-]+/[\w.-]+)/config\.json")
"""A preset's `_source` that starts with the Hugging Face file it transcribes: ORG/NAME."""


@functools.cache
def preset_hub_ids() -> dict[str, str]:
    """Each built-in preset's Hugging Face id (the ORG/NAME its `_source` starts with), by
    preset name; presets whose source names no hub file are absent."""
    out: dict[str, str] = {}
    for name in preset_names():
        source = json.loads(read_input_text(PRESET_DIR / f"{name}.json")).get("_source", "")
        match = HUB_SOURCE.match(source)
        if match:
            out[name] = match.group(1)
    return out


def _read_json(path: Path) -> dict[str, Any]:
    text = read_input_text(path, what="model")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"model: {path}: not a JSON object ({first})") from None
    if not isinstance(data, dict):
        raise ValueError(f"model: {path}: not a JSON object")
    return data


@functools.cache
def _load_cached(name_or_path: str, family: str | None = None) -> ModelSpec:
    path = Path(name_or_path)
    if name_or_path in preset_names():
        return model_from_hf_config(
            _read_json(PRESET_DIR / f"{name_or_path}.json"), name=name_or_path, family=family
        )
    check_path_name(name_or_path, what="model")
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.is_file():
        return model_from_hf_config(_read_json(path), name=os.fspath(name_or_path), family=family)
    raise ValueError(
        f"model: unknown model '{name_or_path}'; {did_you_mean(name_or_path, preset_names())}"
        f"give a path to a Hugging Face config.json or one of: {', '.join(preset_names())}"
    )


def _user_dir(models_dir: str | os.PathLike[str] | None) -> Path | None:
    """The user preset folder: `models_dir` if given, else $TRAINMEM_MODELS_DIR if non-empty."""
    chosen = models_dir if models_dir is not None else os.environ.get(ENV_VAR) or None
    if chosen is None:
        return None
    check_path_name(chosen, what="models dir")
    folder = Path(chosen)
    if not folder.is_dir():
        raise ValueError(f"models dir {str(folder)!r} is not a directory")
    return folder


def model_presets(models_dir: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Every preset name and where it comes from ("built-in" or the user file's path), sorted.

    The user folder is `models_dir` if given, else ``$TRAINMEM_MODELS_DIR``; every ``*.json``
    directly in it is a preset named by its stem; one with a built-in's name overrides it.
    """
    found = dict.fromkeys(preset_names(), BUILTIN)
    folder = _user_dir(models_dir)
    if folder is not None:
        found.update({f.stem: os.fspath(f) for f in sorted(folder.glob("*.json"))})
    return dict(sorted(found.items()))


def _load_user(path: str, name: str, family: str | None = None) -> ModelSpec:
    return model_from_hf_config(_read_json(Path(path)), name=name, family=family)


def load_model(
    name_or_path: str | os.PathLike[str],
    *,
    models_dir: str | os.PathLike[str] | None = None,
    family: str | None = None,
) -> ModelSpec:
    """A preset by name (user folder first, see `model_presets`), or any Hugging Face
    config.json (file or folder) by local path. `family` (engine FAMILIES) reads a config.json
    whose model_type trainmem does not know with that family's layout (`--family`)."""
    key = os.fspath(name_or_path)
    source = model_presets(models_dir).get(key) if "/" not in key else None
    if source is not None and source != BUILTIN:
        return _load_user(source, key, family)
    try:
        return _load_cached(key, family)
    except ValueError as exc:
        if "unknown model" not in str(exc):
            raise
        names = model_presets(models_dir)
        raise ValueError(
            f"model: unknown model '{key}'; {did_you_mean(key, names)}give a path to a Hugging "
            f"Face config.json or one of: {', '.join(names)}"
        ) from None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``did you mean 'x'? `` for the known name closest to `name` (difflib), else ``""``."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def model_config_dict(
    name_or_path: str | os.PathLike[str], *, models_dir: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """The raw Hugging Face config fields of a preset (user folder first) or a config.json."""
    key = os.fspath(name_or_path)
    source = model_presets(models_dir).get(key) if "/" not in key else None
    if source == BUILTIN:
        return _read_json(PRESET_DIR / f"{key}.json")
    if source is not None:
        return _read_json(Path(source))
    path = Path(key)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return _read_json(path)
    load_model(key, models_dir=models_dir)  # raises the one-line error naming the presets
    return {}
