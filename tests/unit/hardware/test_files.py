"""The bounded reader of input files (hardware/_files.py, which catalog imports too): a cap,
regular files only, UTF-8, names the file system can hold; every
refusal one ValueError line naming the file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainmem.hardware import _files

ROOT = Path(__file__).parents[3]
READERS = [_files.read_input_text]


@pytest.mark.parametrize("read", READERS)
def test_a_small_utf8_file_is_read(tmp_path: Path, read) -> None:
    (tmp_path / "a.toml").write_text('name = "é"\n', encoding="utf-8")
    assert read(tmp_path / "a.toml") == 'name = "é"\n'


def _one_line(info: pytest.ExceptionInfo[ValueError]) -> str:
    text = str(info.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("read", READERS)
def test_refusals_are_one_line_naming_the_file(tmp_path: Path, read) -> None:
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 1025)
    (tmp_path / "latin.json").write_bytes(b'{"a": "\xe9"}')
    (tmp_path / "folder.json").mkdir()
    cases = [
        (big, {"cap_bytes": 1024}, "larger than 1,024 bytes"),
        (tmp_path / "latin.json", {}, "not UTF-8 text (byte 7)"),
        (tmp_path / "folder.json", {}, "is a folder"),
        (tmp_path / "absent.json", {}, "no such file"),
        (tmp_path / ("x" * 300), {}, "file name too long (300 bytes in one name"),
        ("/dev/null", {}, "not a regular file"),
    ]
    for path, kwargs, reason in cases:
        with pytest.raises(ValueError) as info:
            read(path, what="model", **kwargs)
        line = _one_line(info)
        assert line.startswith("model: ") and reason in line, line
        assert os.fspath(path)[-20:] in line or "..." in line, line


def test_a_file_at_the_cap_is_read_and_one_byte_more_is_not(tmp_path: Path) -> None:
    path = tmp_path / "cap.txt"
    path.write_bytes(b"a" * 64)
    assert len(_files.read_input_text(path, cap_bytes=64)) == 64
    path.write_bytes(b"a" * 65)
    with pytest.raises(ValueError, match="larger than 64 bytes"):
        _files.read_input_text(path, cap_bytes=64)


def test_names_with_a_nul_or_a_newline_stay_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="NUL byte") as info:
        _files.check_path_name("a\0b", what="out")
    _one_line(info)
    with pytest.raises(ValueError) as info:
        _files.read_input_text(tmp_path / "a\nb.toml")
    assert "\\n" in _one_line(info)


def test_a_long_path_of_short_names_is_refused() -> None:
    with pytest.raises(ValueError, match="path too long"):
        _files.check_path_name("/".join(["d" * 200] * 30), what="out")


_GUARDED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from trainmem.hardware._files import read_input_text
try:
    read_input_text(sys.argv[1], what="x")
except ValueError as error:
    print(error)
"""


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "symlink-to-dev-zero"])
def test_endless_or_blocking_files_are_refused_at_once(tmp_path: Path, kind: str) -> None:
    """A FIFO with no writer would block open(); /dev/zero would never end. In a child with a
    timeout and a memory cap, so that a regression cannot hang or swamp the suite."""
    path = tmp_path / "input.toml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink-to-dev-zero":
        path.symlink_to("/dev/zero")
    else:
        path = Path("/dev/zero")
    result = subprocess.run(
        [sys.executable, "-c", _GUARDED, str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-500:]
    assert "not a regular file" in result.stdout and str(path) in result.stdout
