"""Query stored points: a WHERE expression over the points table's columns, a sort column, a
row limit.

`--where` is not pasted into SQL as written: `check_where` first accepts only an expression over
the table (column names, literals, comparisons, AND/OR/NOT, IN, BETWEEN, IS [NOT] NULL, LIKE,
arithmetic and parentheses), so no subquery, function call (read_parquet, ...), statement
separator or comment reaches polars' SQL engine.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import polars as pl

from ._store import open_part, part_files, scan_points

WHERE_KEYWORDS = frozenset(
    {"and", "or", "not", "in", "between", "is", "null", "like", "ilike", "true", "false"}
)
"""The SQL words a --where expression may use (case-insensitive)."""
MAX_HEAD_ROWS = 2**32 - 1
"""The most rows `head` may ask for (polars' row index is 32 bits)."""
MAX_WHERE_INTEGER = 2**53
"""The largest integer a --where literal may write (float64's exact range; the stored integers
are far below it). Arithmetic over integer columns and integer literals is 64-bit and wraps past
2^63 without a word (polars), so a larger literal is refused: write it as a decimal (4.6e18),
which computes in floating point."""
_TOKEN = re.compile(
    r"""\s+
    |(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
    |(?P<string>'(?:[^']|'')*')
    |(?P<quoted>"(?:[^"]|"")+")
    |(?P<word>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<operator><=|>=|<>|!=|=|<|>|\+|-|\*|/|%|\(|\)|,)
    """,
    re.VERBOSE,
)


def check_where(where: str, columns: Sequence[str]) -> None:
    """ValueError ("where: ...") unless `where` is an expression over `columns`: column names
    (bare or "double-quoted"), numbers, 'strings', = != <> < <= > >= + - * / %, parentheses,
    commas inside IN (...), and the words in WHERE_KEYWORDS."""
    names = set(columns)
    position, previous = 0, ""
    while position < len(where):
        match = _TOKEN.match(where, position)
        if match is None:
            bad = where[position : position + 10]
            raise ValueError(
                f"--where: {bad!r} is not allowed (only an expression over the columns)"
            )
        text, kind = match.group(0), match.lastgroup
        if where.startswith(("--", "/*"), position):
            raise ValueError("--where: comments are not allowed")
        if kind == "number" and text.isdigit() and _above_exact(text):
            raise ValueError(
                f"--where: integer {_shown(text)} is above 2^53; 64-bit arithmetic would wrap "
                "silently: write it as a decimal (4.6e18) to compute in floating point"
            )
        if kind == "word":
            lower = text.lower()
            if lower not in WHERE_KEYWORDS and text not in names:
                after = where[match.end() :].lstrip()
                what = "function calls" if after.startswith("(") else "unknown column"
                if what == "function calls":
                    raise ValueError(f"--where: {text}(...): function calls are not allowed")
                raise ValueError(f"--where: {what} {text!r}; columns: {', '.join(columns)}")
        elif kind == "quoted" and text[1:-1].replace('""', '"') not in names:
            raise ValueError(f"--where: unknown column {text}; columns: {', '.join(columns)}")
        elif (
            kind == "operator"
            and text == "("
            and re.fullmatch(r"[A-Za-z_]\w*", previous)
            and previous.lower() not in WHERE_KEYWORDS
        ):
            raise ValueError(f"--where: {previous}(...): function calls are not allowed")
        if kind is not None:
            previous = text
        position = match.end()


def _above_exact(digits: str) -> bool:
    """Whether the integer literal `digits` exceeds MAX_WHERE_INTEGER (length first: Python
    refuses to convert more than 4,300 digits)."""
    digits = digits.lstrip("0")
    return len(digits) > 16 or int(digits or "0") > MAX_WHERE_INTEGER


def _shown(text: str) -> str:
    return text if len(text) <= 30 else f"{text[:12]}...{text[-12:]} ({len(text)} digits)"


def check_parts(path: str | os.PathLike[str]) -> None:
    """ValueError ("points: FILE: not a Parquet file") for a part without Parquet's magic
    (under a folder or a URL)."""
    fs, parts = part_files(path)
    for part in parts:
        try:
            with open_part(fs, part) as f:
                head = f.read(4)
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(size - 4, 0))
                tail = f.read(4)
        except OSError as exc:
            raise ValueError(f"points: {part}: cannot read ({exc.strerror or exc})") from None
        if size < 12 or head != b"PAR1" or tail != b"PAR1":
            raise ValueError(f"points: {part}: not a Parquet file")


def query_points(
    path: str | os.PathLike[str],
    *,
    where: str | None = None,
    sort: str | None = None,
    descending: bool = False,
    head: int | None = 10,
) -> pl.DataFrame:
    """Stored points under `path`, filtered by `where` (an expression over the columns, e.g.
    "fits AND num_gpus <= 16"; see `check_where`), sorted by `sort` (nulls last), at most `head`
    rows. ValueError on a bad expression, column or part file.

    >>> query_points("out", where="fits", sort="cost_per_million_tokens", head=10)  # doctest: +SKIP
    """
    check_parts(path)
    lf = scan_points(path)
    try:
        names = lf.collect_schema().names()
    except pl.exceptions.PolarsError as error:
        message = " ".join(str(error).split())[:200]
        raise ValueError(f"points: {os.fspath(path)}: unreadable parts: {message}") from None
    if sort is not None and sort not in names:
        raise ValueError(f"--sort: unknown column {sort!r}; columns: {', '.join(names)}")
    if head is not None and not 0 <= head <= MAX_HEAD_ROWS:
        raise ValueError(f"--head: must be in [0, {MAX_HEAD_ROWS:,}], got {head}")
    if where is not None:
        check_where(where, names)
    try:
        if where and where.strip():
            ctx = pl.SQLContext(points=lf)
            lf = ctx.execute(f"SELECT * FROM points WHERE {where}")
        if sort is not None:
            lf = lf.sort(sort, descending=descending, nulls_last=True)
        if head is not None:
            lf = lf.head(head)
        return lf.collect()
    except (pl.exceptions.PolarsError, pl.exceptions.SQLSyntaxError) as error:
        message = " ".join(str(error).split())
        raise ValueError(f"--where: {message}") from None
