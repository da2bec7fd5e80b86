"""Activation profile files (`trainmem trace --save-profile`) read into a ModelSpec.

The format and its validation are the engine's (engine/_activation_profile.py).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainmem.engine import ModelSpec


def load_profile(path: str | os.PathLike[str]) -> ModelSpec:
    """Read a profile file (see the module docstring) into a ModelSpec the engine estimates with.

    Bad files raise one ValueError naming the file and the field.
    """
    where = f" {os.fspath(path)}"
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise ValueError(f"profile{where}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"profile{where}: not JSON: {exc.msg} (line {exc.lineno})") from None
    from trainmem.engine import profile_model  # the profile code loads for a profile only

    return profile_model(data, where=where)
