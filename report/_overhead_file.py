"""`--overhead-file FILE.toml`: overhead values from a file (what `trainmem explain --calibrate`
writes), the same keys as `--overhead KEY=VALUE` (engine Overheads' names) and checked the same
way; `--overhead` items given beside it win.

The file is flat TOML, one `key = number` per overhead (comments allowed):

    # trainmem explain run.pickle --calibrate cal.toml
    cuda_context_bytes = 812646400
    fragmentation_fraction = 0.071
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence

from trainmem.engine import Overheads, overheads_for
from trainmem.hardware import GpuProfile
from trainmem.hardware._files import check_path_name, read_input_text, shown_path

from ._validate import check_overhead_bytes, key_numbers

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MAX_OVERHEAD_FILE_BYTES = 64 << 10
"""The most an overhead file holds (64 KiB: a handful of keys and comments)."""


def overhead_file_values(path: str | None) -> dict[str, float]:
    """The overheads a file gives (key -> number), checked as --overhead's are (a known key, a
    finite number in range: Overheads.with_overrides); {} without a file."""
    if path is None:
        return {}
    head = f"overhead_file: {shown_path(path)}"
    text = read_input_text(path, what="overhead_file", cap_bytes=MAX_OVERHEAD_FILE_BYTES)
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{head}: not TOML ({str(error).splitlines()[0]})") from None
    names = Overheads.names()
    out: dict[str, float] = {}
    for key, value in table.items():
        if key not in names:
            raise ValueError(f"{head}: unknown key '{key}'; allowed: {', '.join(names)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{head}: {key} must be a number, got {type(value).__name__}")
        out[key] = float(value)
    try:
        Overheads().with_overrides(out)
    except ValueError as exc:
        raise ValueError(f"{head}: {str(exc).removeprefix('overhead: ')}") from None
    return out


def overhead_items(overhead_file: str | None, overhead: list[str] | None) -> list[str]:
    """--overhead's KEY=VALUE items with the file's first (a flag given beside it wins)."""
    from_file = [f"{k}={v!r}" for k, v in overhead_file_values(overhead_file).items()]
    return [*from_file, *(overhead or [])]


def overhead_overrides(
    overhead_file: str | None,
    overhead: list[str] | None,
    *,
    profiles: Sequence[GpuProfile] = (),
) -> dict[str, float]:
    """The overhead values a command puts over each GPU's defaults (`gpu_overheads`): the
    file's, then the --overhead items (a flag given beside the file wins), checked as estimate
    checks them (a known key, a number in range, bytes within every GPU of `profiles`): one
    ValueError line naming --overhead or overhead_file; {} when neither is given."""
    items = overhead_items(overhead_file, overhead)
    overrides = key_numbers("--overhead", items, Overheads.names())
    Overheads().with_overrides(overrides)  # an unknown key, a value out of range
    for profile in profiles:
        check_overhead_bytes(overrides, profile)
    return overrides


def gpu_overheads(profile: GpuProfile, overrides: Mapping[str, float]) -> Overheads:
    """The overheads of one GPU: its own defaults (`overheads_for`: its architecture's cuBLAS
    workspace, its TOML's or architecture's CUDA context), each key of `overrides` in place of
    the GPU's (the user's values win over every GPU's own)."""
    own = overheads_for(profile.arch, cuda_context_bytes=profile.cuda_context_bytes)
    return own.with_overrides(dict(overrides)) if overrides else own


def overhead_toml(values: Mapping[str, float], *, comment: str) -> str:
    """The text `--overhead-file` reads: `comment` lines, then one `key = value` per overhead
    (bytes as integers, fractions and factors as floats)."""
    lines = [f"# {line}" for line in comment.splitlines()]
    for key, value in values.items():
        if not math.isfinite(value):
            raise ValueError(f"calibrate: {key} is not a finite number ({value})")
        shown = repr(float(value)) if not key.endswith("_bytes") else str(int(round(value)))
        lines.append(f"{key} = {shown}")
    return "\n".join(lines) + "\n"


def check_output_path(path: str, *, what: str) -> None:
    """ValueError (one line naming `what`) when `path` cannot name the file to write: a bad
    name or a folder (checked before any work, so that nothing is half done)."""
    check_path_name(path, what=what)
    if os.path.isdir(path):
        raise ValueError(f"{what}: {shown_path(path)}: is a folder, give a file name")


def write_text_atomically(path: str, text: str, *, what: str) -> None:
    """`text` at `path`, whole or not at all: its folder made if missing (as the pictures'
    writers do), a temporary file in it, flushed, then renamed over `path`; a failure is one
    ValueError line naming `what`."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        _write(folder, path, text)
    except OSError as error:
        reason = error.strerror or str(error)
        raise ValueError(f"{what}: {shown_path(path)}: cannot write ({reason})") from None


def _write(folder: str, path: str, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".trainmem-", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as open() would make it (mkstemp's is 0600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
