"""Bounded reading of the files a user names: one reader for every text input (config.json,
GPU and optimizer TOMLs, fleets, profiles, stack configs) and one check of a path's length.

Every error is one ValueError line naming the file: a missing file, a folder, a device, FIFO or
socket (refused before it is read: /dev/zero would never end, a FIFO without a writer never
starts), more than the cap (16 MiB; read at most one byte past it), text that is not UTF-8, a
name longer than the file system allows (ENAMETOOLONG, checked before any lookup).

It lives in hardware, a leaf that every package reading user files may import (catalog
included; engine reads no files).
"""

from __future__ import annotations

import errno
import os
import stat

MAX_INPUT_BYTES = 16 << 20
"""The most an input file may hold (16 MiB): the largest shipped config.json or profile is a
few KiB, so this bound refuses only what is no input (an endless or binary file)."""
NAME_MAX_BYTES = 255
"""A path component's limit where the file system does not say (Linux NAME_MAX)."""
PATH_MAX_BYTES = 4096
"""A whole path's limit where the file system does not say (Linux PATH_MAX, with its NUL)."""


def shown_path(path: str | os.PathLike[str]) -> str:
    """A path as an error line shows it: as given (quoted if it holds a character that does not
    print, a newline say), its middle elided past 120 characters."""
    text = os.fspath(path)
    if len(text) > 120:
        text = f"{text[:50]}...{text[-50:]}"
    return text if text.isprintable() else repr(text)


def _limits(path: str) -> tuple[int, int]:
    """(NAME_MAX, PATH_MAX) of the file system of `path`'s nearest existing folder."""
    folder = os.path.dirname(os.path.abspath(path)) or os.sep
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    try:
        return os.pathconf(folder, "PC_NAME_MAX"), os.pathconf(folder, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):  # no pathconf (Windows) or no answer
        return NAME_MAX_BYTES, PATH_MAX_BYTES


def check_path_name(path: str | os.PathLike[str], *, what: str = "") -> None:
    """ValueError (one line, `what` first if given) when `path` cannot name a file: a NUL byte, a
    component longer than the file system's NAME_MAX or a whole longer than its PATH_MAX."""
    text = os.fspath(path)
    head = f"{what}: {shown_path(text)}" if what else shown_path(text)
    if "\0" in text:
        raise ValueError(f"{head}: a path may not hold a NUL byte")
    name_max, path_max = _limits(text)
    longest = max((len(os.fsencode(part)) for part in text.split(os.sep)), default=0)
    if longest > name_max:
        raise ValueError(
            f"{head}: file name too long ({longest} bytes in one name; "
            f"the file system allows {name_max})"
        )
    if len(os.fsencode(text)) >= path_max:
        raise ValueError(
            f"{head}: path too long ({len(os.fsencode(text))} bytes; "
            f"the file system allows {path_max - 1})"
        )


def read_input_bytes(
    path: str | os.PathLike[str], *, what: str = "", cap_bytes: int = MAX_INPUT_BYTES
) -> bytes:
    """The bytes of the regular file `path`, read to at most `cap_bytes` (one byte past it
    says the file is larger); ValueError (one line: `what`, the file, the reason)."""
    head = f"{what}: {shown_path(path)}" if what else shown_path(path)
    check_path_name(path, what=what)
    try:
        return _read_capped(os.fspath(path), cap_bytes)
    except FileNotFoundError:
        raise ValueError(f"{head}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{head}: is a folder, not a file") from None
    except _NotInput as refused:
        raise ValueError(f"{head}: {refused}") from None
    except OSError as error:
        raise ValueError(f"{head}: cannot read ({error.strerror or error})") from None


def read_input_text(
    path: str | os.PathLike[str], *, what: str = "", cap_bytes: int = MAX_INPUT_BYTES
) -> str:
    """The UTF-8 text of the regular file `path`, read to at most `cap_bytes` (one byte past
    it says the file is larger); ValueError (one line: `what`, the file, the reason)."""
    head = f"{what}: {shown_path(path)}" if what else shown_path(path)
    data = read_input_bytes(path, what=what, cap_bytes=cap_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{head}: not UTF-8 text (byte {error.start})") from None


class _NotInput(Exception):
    """A file that is no input: not a regular file, or larger than the cap (why, in words)."""


def _read_capped(path: str, cap_bytes: int) -> bytes:
    """At most `cap_bytes` of a regular file (_NotInput past them). Opened without blocking,
    so that a FIFO is refused at once instead of waiting for a writer."""
    too_large = f"larger than {_size_text(cap_bytes)}, the most an input file may hold"
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a folder")
        if not stat.S_ISREG(info.st_mode):
            raise _NotInput("not a regular file (a device, FIFO or socket); give a file")
        if info.st_size > cap_bytes:
            raise _NotInput(too_large)
        chunks, total = [], 0
        while total <= cap_bytes:
            chunk = os.read(fd, min(1 << 20, cap_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > cap_bytes:  # grew while read, or a file whose size stat does not tell
            raise _NotInput(too_large)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _size_text(num_bytes: int) -> str:
    if num_bytes >= 1 << 20 and num_bytes % (1 << 20) == 0:
        return f"{num_bytes >> 20} MiB"
    return f"{num_bytes:,} bytes"
