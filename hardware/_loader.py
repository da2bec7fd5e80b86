"""Read GPU profiles from TOML: the built-in folder, then an optional user folder on top."""

from __future__ import annotations

import difflib
import functools
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ._files import check_path_name, read_input_text
from ._gpu import _FLOAT_FIELDS, GpuProfile

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

ENV_VAR = "TRAINMEM_HARDWARE_DIR"
"""Environment variable naming a folder of extra or overriding ``<name>.toml`` files."""

_BUILTIN_DIR = Path(__file__).parent / "gpus"
"""Shipped profiles (package data ``trainmem.hardware/gpus/*.toml``)."""

_ALIASES_FILE = Path(__file__).parent / "aliases.toml"
"""Short names (``h100``) for built-in profiles: one table of ``alias = "profile name"``."""

_KEYS = frozenset(f.name for f in fields(GpuProfile)) - {"path"}
_OPTIONAL_KEYS = frozenset({"host_memory_bytes", "cuda_context_bytes", "fp4_flops"})
"""Keys a profile file may leave out (files written before they existed keep loading)."""


def load_gpus(hardware_dir: str | os.PathLike[str] | None = None) -> dict[str, GpuProfile]:
    """All known GPUs by name: the built-in profiles, overridden by a user folder.

    The user folder is `hardware_dir` if given, else ``$TRAINMEM_HARDWARE_DIR`` if set and
    non-empty. Every ``*.toml`` directly in it is read; a file whose stem matches a built-in name
    replaces that profile, any other adds one.

    Raises ValueError naming the file for unreadable TOML, missing or unknown keys, a ``name``
    that differs from the file stem, or values that break a `GpuProfile` rule.
    """
    gpus = dict(_builtin_gpus())
    user_dir = hardware_dir if hardware_dir is not None else os.environ.get(ENV_VAR) or None
    if user_dir is not None:
        check_path_name(user_dir, what="hardware dir")
        folder = Path(user_dir)
        if not folder.is_dir():
            raise ValueError(f"hardware dir {str(folder)!r} is not a directory")
        gpus.update(_read_folder(sorted(folder.glob("*.toml"))))
    return gpus


def get_gpu(name: str, hardware_dir: str | os.PathLike[str] | None = None) -> GpuProfile:
    """The profile called `name` or its alias (see `gpu_aliases`); ValueError listing the
    allowed names, with the closest one, if there is none."""
    gpus = load_gpus(hardware_dir)
    resolved = resolve_gpu_name(name, gpus)
    if resolved is None:
        raise ValueError(f"unknown gpu {name!r}; {allowed_gpus_text(name, gpus)}")
    return gpus[resolved]


def gpu_aliases(gpus: Mapping[str, GpuProfile]) -> dict[str, str]:
    """Alias -> profile name, for the aliases whose profile is in `gpus` and that are not
    themselves a profile name (a user file named ``h100.toml`` wins over the alias)."""
    return {
        alias: target
        for alias, target in _builtin_aliases().items()
        if target in gpus and alias not in gpus
    }


def resolve_gpu_name(name: str, gpus: Mapping[str, Any]) -> str | None:
    """The profile name that `name` means, None if unknown: the one lookup of a GPU name
    behind every face (``--gpu``, ``--fleet``, fleet files, stack files, HTTP, Python).

    Case does not matter (``H100``, ``8xH100``: people type GPU names as marketed): profile
    names are lower-case by rule (`GpuProfile`), so `name` lower-cased is looked up among
    them, then among the aliases (`gpu_aliases`, lower-cased too). `gpus` maps profile names
    to anything (`load_gpus()`, or names -> GPUs per node); only its keys are read.
    """
    if name in gpus:
        return name
    key = name.lower()
    if key in gpus:
        return key
    return {alias.lower(): target for alias, target in gpu_aliases(gpus).items()}.get(key)


def allowed_gpus_text(name: str, gpus: Mapping[str, GpuProfile]) -> str:
    """``did you mean 'x'? allowed: a, b, ...`` for an unknown GPU name (hint only if close)."""
    return f"{did_you_mean(name, [*gpus, *gpu_aliases(gpus)])}allowed: {', '.join(sorted(gpus))}"


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``did you mean 'x'? `` for the known name closest to `name` (difflib, compared
    lower-cased as `resolve_gpu_name` matches), else ``""``."""
    spelled = {k.lower(): k for k in reversed(list(known))}
    close = difflib.get_close_matches(name.lower(), list(spelled), n=1)
    return f"did you mean {spelled[close[0]]!r}? " if close else ""


@functools.cache
def _builtin_aliases() -> Mapping[str, str]:
    """The shipped alias table, read once per process (read-only view)."""
    table = tomllib.loads(read_input_text(_ALIASES_FILE))
    return MappingProxyType({str(alias): str(target) for alias, target in table.items()})


@functools.cache
def _builtin_gpus() -> Mapping[str, GpuProfile]:
    """The shipped profiles, read once per process (read-only view)."""
    return MappingProxyType(_read_folder(sorted(_BUILTIN_DIR.glob("*.toml"))))


def _read_folder(files: Iterable[Path]) -> dict[str, GpuProfile]:
    gpus: dict[str, GpuProfile] = {}
    for file in files:
        profile = _read_file(file)
        gpus[profile.name] = profile
    return gpus


def _read_file(file: Path) -> GpuProfile:
    label = file.name
    try:
        table = tomllib.loads(read_input_text(file))
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{label}: invalid TOML: {error}") from None
    missing = sorted(_KEYS - _OPTIONAL_KEYS - table.keys())
    unknown = sorted(table.keys() - _KEYS)
    problems = []
    if missing:
        problems.append(f"missing keys: {', '.join(missing)}")
    if unknown:
        problems.append(f"unknown keys: {', '.join(unknown)}")
    stem = label.removesuffix(".toml")
    if "name" in table and table["name"] != stem:
        problems.append(f"name {table['name']!r} must equal the file stem {stem!r}")
    if problems:
        raise ValueError(f"{label}: {'; '.join(problems)}")
    return GpuProfile(**_coerce(table), path=str(file))


def _coerce(table: dict[str, Any]) -> dict[str, Any]:
    """TOML ints where floats are meant become floats; the sources array becomes a tuple."""
    values = dict(table)
    for key in _FLOAT_FIELDS:
        if key not in values:  # an optional rate left out (fp4_flops): the field's default
            continue
        value = values[key]
        if isinstance(value, int) and not isinstance(value, bool):
            values[key] = float(value)
    if isinstance(values["sources"], list):
        values["sources"] = tuple(values["sources"])
    return values
