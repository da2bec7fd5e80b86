"""Activation profile files (`trainmem trace --save-profile`) read into a ModelSpec.

The format and its validation are the engine's (engine/_activation_profile.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from trainmem.hardware._files import read_input_text

if TYPE_CHECKING:
    from trainmem.engine import ModelSpec


PROFILES = Path(__file__).resolve().parent / "profiles"
"""Traced profiles shipped with trainmem (`--profile NAME`): T5 (encoder-decoders, which the
formulas do not model; tests/data/trace_modules/t5.py traced them, docs/models.md)."""


def builtin_profiles() -> list[str]:
    """Names of the shipped profiles (`--profile NAME`)."""
    return sorted(f.stem for f in PROFILES.glob("*.json"))


def load_profile(path: str | os.PathLike[str]) -> ModelSpec:
    """Read a profile file (see the module docstring) into a ModelSpec the engine estimates with;
    a name that is no file but a shipped profile's (builtin_profiles) reads that one.

    Bad files raise one ValueError naming the file and the field.
    """
    text = os.fspath(path)
    bare = os.sep not in text and "/" not in text and not text.endswith(".json")
    if bare and not os.path.exists(text):
        if text not in builtin_profiles():
            names = ", ".join(builtin_profiles())
            raise ValueError(f"profile {text}: no such file, nor a shipped profile ({names})")
        path = PROFILES / f"{text}.json"
    where = f" {os.fspath(path)}"
    body = read_input_text(path, what="profile")
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"profile{where}: not JSON: {exc.msg} (line {exc.lineno})") from None
    from trainmem.engine import profile_model  # the profile code loads for a profile only

    return profile_model(data, where=where)
