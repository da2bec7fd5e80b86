"""User optimizers: ``<name>.toml`` files in a folder (``--optimizers-dir`` or
``$TRAINMEM_OPTIMIZERS_DIR``) read into engine OptimizerSpecs, next to the built-in registry.

The file format (keys, units, rules) is OptimizerSpec's, in engine/_optimizers.py.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from trainmem.engine import OPTIMIZERS, OptimizerSpec, builtin_optimizers, spec_columns
from trainmem.hardware._files import check_path_name, read_input_text

from ._presets import did_you_mean

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ENV_VAR = "TRAINMEM_OPTIMIZERS_DIR"
"""Environment variable naming a folder of user optimizer ``<name>.toml`` files."""

_BUILTIN_ONLY = frozenset(
    {"device_step_scalars", "factored_second_moment", "paged", "loop_temp_tensors"}
)
_KEYS = frozenset(f.name for f in dataclasses.fields(OptimizerSpec)) - {"path"} - _BUILTIN_ONLY
_REQUIRED = _KEYS - {"sources", "description"}


def _user_dir(optimizers_dir: str | os.PathLike[str] | None) -> Path | None:
    chosen = optimizers_dir if optimizers_dir is not None else os.environ.get(ENV_VAR) or None
    if chosen is None:
        return None
    check_path_name(chosen, what="optimizers dir")
    folder = Path(chosen)
    if not folder.is_dir():
        raise ValueError(f"optimizers dir {str(folder)!r} is not a directory")
    return folder


def load_optimizers(
    optimizers_dir: str | os.PathLike[str] | None = None,
) -> dict[str, OptimizerSpec]:
    """Every optimizer by name: the built-ins, then each ``*.toml`` of the user folder.

    Raises ValueError naming the file for unreadable TOML, missing or unknown keys, a ``name``
    that differs from the file stem or that is a built-in's, or values that break a rule.
    """
    found = builtin_optimizers()
    folder = _user_dir(optimizers_dir)
    if folder is not None:
        for file in sorted(folder.glob("*.toml")):
            spec = read_optimizer_file(os.fspath(file))
            found[spec.name] = spec
    return found


def read_optimizer_file(path: str) -> OptimizerSpec:
    """One user optimizer file, validated."""
    file = Path(path)
    label = file.name
    try:
        table = tomllib.loads(read_input_text(file))
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{label}: invalid TOML: {error}") from None
    problems = []
    missing = sorted(_REQUIRED - table.keys())
    unknown = sorted(table.keys() - _KEYS)
    if missing:
        problems.append(f"missing keys: {', '.join(missing)}")
    if unknown:
        problems.append(f"unknown keys: {', '.join(unknown)}")
    stem = label.removesuffix(".toml")
    if "name" in table and table["name"] != stem:
        problems.append(f"name {table['name']!r} must equal the file stem {stem!r}")
    if problems:
        raise ValueError(f"{label}: {'; '.join(problems)}")
    values: dict[str, Any] = dict(table)
    for key in ("num_states", "state_bytes", "step_temp_states", "step_bytes_per_parameter"):
        if isinstance(values[key], int) and not isinstance(values[key], bool):
            values[key] = float(values[key])
    values["sources"] = tuple(values.get("sources", ()))
    values.setdefault("description", "")
    try:
        return OptimizerSpec(**values, path=path)
    except ValueError as error:
        raise ValueError(f"{label}: {error}") from None


def optimizer_columns(
    name: str, optimizers_dir: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """The grid fields that select optimizer `name` (a built-in or a user file's name); a
    missing `optimizers_dir` is an error whatever the name (as a missing hardware dir is)."""
    _user_dir(optimizers_dir)
    if name in OPTIMIZERS:
        return {"optimizer": name}
    found = load_optimizers(optimizers_dir)
    if name not in found:
        raise ValueError(
            f"optimizer: unknown value '{name}'; {did_you_mean(name, found)}"
            f"allowed: {', '.join(found)}"
        )
    return spec_columns(found[name])
