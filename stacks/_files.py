"""A job's config files as `Doc`s: parsed by their syntax (JSON, YAML, TOML, or a shell script
/ launch line, which readers tokenise themselves). A file that does not parse is one line naming
the file and the line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from trainmem.hardware._files import read_input_text

from ._reading import Doc

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

SYNTAXES = ("yaml", "json", "toml", "shell")
SUFFIXES = {
    ".json": "json",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".toml": "toml",
    ".sh": "shell",
    ".bash": "shell",
    ".slurm": "shell",
    ".sbatch": "shell",
    ".txt": "shell",
}
MAX_FILE_BYTES = 4 << 20
"""A config file is small; a bigger one is refused before it is parsed (4 MiB)."""


def read_files(paths: list[str]) -> dict[str, str]:
    """The text of each file on the command line, by the name `check` reports it under (the
    path as given). A missing or unreadable file is one line naming it."""
    if not paths:
        raise ValueError("files: give at least one config file")
    out: dict[str, str] = {}
    for path in paths:
        if not path.strip():
            raise ValueError(f"files: {path!r} names no file")
        out[path] = read_input_text(path, cap_bytes=MAX_FILE_BYTES)
    return out


def parse(name: str, text: str) -> Doc:
    """One file as a Doc, its syntax from its suffix (else sniffed: `{` JSON, TOML tables,
    YAML mappings, anything else a shell script)."""
    if not isinstance(text, str):
        raise ValueError(f"{name}: the file's text must be a string")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        raise ValueError(f"{name}: larger than {MAX_FILE_BYTES >> 20} MiB; not a config")
    syntax = SUFFIXES.get(os.path.splitext(name)[1].lower()) or sniff(text)
    data = _load(name, text, syntax)
    if syntax != "shell" and not isinstance(data, Mapping):
        raise ValueError(f"{name}: expected a mapping of keys at the top level, got {_kind(data)}")
    return Doc(name=name, text=text, data=data, syntax=syntax)


def sniff(text: str) -> str:
    """The syntax of a file with no telling suffix."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return "json"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and ln.strip()[0] != "#"]
    if lines and lines[0].startswith("[") and lines[0].endswith("]"):
        return "toml"
    if text.startswith("#!") or any(_shellish(ln) for ln in lines[:3]):
        return "shell"
    try:
        import yaml

        data = yaml.safe_load(text)
    except Exception:
        return "shell"
    return "yaml" if isinstance(data, Mapping) else "shell"


def _shellish(line: str) -> bool:
    first = line.split()[0] if line.split() else ""
    return first in {
        "torchrun",
        "python",
        "python3",
        "deepspeed",
        "accelerate",
        "srun",
        "sbatch",
        "tune",
        "litgpt",
        "export",
        "set",
        "llamafactory-cli",
        "axolotl",
    } or ("=" in first and not first.startswith("-") and ":" not in first)


def _load(name: str, text: str, syntax: str) -> Any:
    if syntax == "json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if syntax == "toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{name}: not valid TOML ({' '.join(str(exc).split())})") from None
    if syntax == "yaml":
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}: " if mark is not None else ""
            problem = getattr(exc, "problem", None) or "cannot parse"
            raise ValueError(f"{name}: not valid YAML ({where}{problem})") from None
    return None


def _kind(data: Any) -> str:
    return "nothing" if data is None else type(data).__name__
