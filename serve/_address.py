"""The service's start-up checks, before uvicorn runs: the address to bind (resolved and bound
once, so that a bad host or a taken port is one line, not uvicorn's error after the banner) and
the bounds of `Limits`."""

from __future__ import annotations

import math
import os
import socket
from typing import Any

MAX_CONCURRENT_PER_CPU = 4
"""Worker processes per CPU at most (`max_concurrent`): each is a process of its own (~100 MB);
past a few per core they only queue for the CPU, and 100,000 would spawn for minutes."""
LIMIT_BOUNDS: dict[str, tuple[float, float]] = {
    "max_body_bytes": (1, 64 << 20),
    "max_grid_rows": (1, 1 << 24),
    "max_points": (1, 1_000_000_000),
    "timeout_s": (1e-6, 3600.0),
}
"""Inclusive bounds of the other limits: far above any request (a body of 64 KiB, fit grids of
65,536, a recommend space of 2,000,000 points in ~10 s, 30 s per request) and far below what
would hold the service for hours or its memory."""


def max_concurrent_bound() -> int:
    """The most computations at once: MAX_CONCURRENT_PER_CPU per CPU this process may use."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return MAX_CONCURRENT_PER_CPU * max(cpus or 1, 1)


def limit_problems(values: dict[str, Any]) -> list[str]:
    """Each limit out of its bounds, as `name: must be in [lo, hi], got v` (empty: all good)."""
    bounds = {**LIMIT_BOUNDS, "max_concurrent": (1, max_concurrent_bound())}
    problems = []
    for name, (low, high) in bounds.items():
        value = values[name]
        integral = name != "timeout_s"
        kind = "a whole number" if integral else "a number"
        if isinstance(value, bool) or not isinstance(value, int if integral else (int, float)):
            problems.append(f"{name}: must be {kind}, got {value!r}")
        elif not (math.isfinite(value) and low <= value <= high):
            shown = f"[{low:g}, {high:g}]" if not integral else f"[{int(low)}, {int(high):,}]"
            note = f" ({MAX_CONCURRENT_PER_CPU} per CPU)" if name == "max_concurrent" else ""
            problems.append(f"{name}: must be in {shown}{note}, got {value!r}")
    return problems


def check_address(host: str, port: int) -> None:
    """ValueError (one line) unless `host` resolves and `host:port` can be bound now."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"port: must be in [1, 65535], got {port!r}")
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError, OSError) as error:
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        raise ValueError(f"host: cannot resolve {host[:200]!r} ({reason})") from None
    family, kind, proto, _, address = found[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as error:
            raise ValueError(
                f"port: cannot bind {host[:200]}:{port} ({error.strerror or error})"
            ) from None
