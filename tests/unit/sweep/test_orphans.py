"""No orphans: a sweep's local worker processes (`--jobs`, Optuna's `--workers`) end soon after
the sweep's own process is SIGKILLed, instead of living on idle for minutes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

psutil = pytest.importorskip("psutil")

TESTS = str(Path(__file__).parent)
SWEEP = """
import sys, time
sys.path.insert(0, {tests!r})
from test_search import small_space
from trainmem.sweep import _exhaustive

real = _exhaustive._exhaustive_chunk

def slow(*args, **kwargs):  # pickled by value: the workers run it
    import time
    time.sleep(1.0)
    return real(*args, **kwargs)

_exhaustive._exhaustive_chunk = slow
_exhaustive.run_exhaustive(small_space(), out={out!r}, study="x", chunk_size=100, jobs=2)
"""
GONE_WITHIN_S = 30.0


def _workers(pid: int, *, count: int, within_s: float = 120.0) -> list:
    """The child processes of `pid` once there are at least `count` (a bounded wait)."""
    parent = psutil.Process(pid)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        children = parent.children(recursive=True)
        if len(children) >= count:
            return children
        time.sleep(0.2)
    raise AssertionError(f"fewer than {count} workers after {within_s} s")


def _alive(procs: list) -> list:
    alive = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            continue
    return alive


def test_workers_die_with_a_killed_sweep(tmp_path) -> None:
    code = SWEEP.format(tests=TESTS, out=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.DEVNULL)
    try:
        workers = _workers(proc.pid, count=2)
        time.sleep(1.0)  # the workers have started their first chunks
        workers = psutil.Process(proc.pid).children(recursive=True)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + GONE_WITHIN_S
        while _alive(workers) and time.monotonic() < deadline:
            time.sleep(0.25)
        left = _alive(workers)
        for p in left:  # never leave them behind, even when the test fails
            p.kill()
        assert left == [], f"{len(left)} worker processes outlived the sweep"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
