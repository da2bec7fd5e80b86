"""The trace child's process tree: found, measured and ended, detached grandchildren included.

A trace child (trace/_child.py) runs the user's model code, which may start processes of its
own: a compile step, a data-loader worker, a daemon that double-forks or calls setsid to leave
the child's session. The parent must end all of them when the trace ends (answered, timed out,
over its memory cap, or dead). Three ways to find them, each covering what the one before
misses:

- the child's session: start_new_session makes the child a session (and process group) leader,
  and every process it starts stays in that session unless it calls setsid;
- the ancestry: a process whose parent chain reaches the child (a setsid'd one whose parent is
  still alive);
- orphans: while a trace runs the parent is the child subreaper (Linux prctl
  PR_SET_CHILD_SUBREAPER), so a process whose parent died (a double-fork's grandchild) is
  reparented to the parent instead of init; a child of the parent started after the trace
  child is one of the trace's.

The child is a subreaper too (adopt_orphans), with a watchdog process of its own
(trace/_child.py _start_watchdog): when trainmem is SIGKILLed, which it cannot see, the watchdog
kills the child's session and descendants, a double-forked grandchild included (reparented to
the child, not to init), and the child.

Where /proc or prctl is missing (not Linux) only the session is killed (os.killpg).

Source: man 2 prctl (PR_SET_CHILD_SUBREAPER, since Linux 3.4), man 5 proc
(/proc/PID/stat fields 3 state, 4 ppid, 6 session, 22 starttime in clock ticks, 24 rss in
pages).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
KILL_GRACE_S = 5.0
"""How long kill_trace goes on finding, killing and reaping before it gives up (SIGKILLed
processes end within milliseconds; one in uninterruptible sleep may not)."""


@dataclass(frozen=True, slots=True)
class Proc:
    """One process as /proc/PID/stat shows it."""

    pid: int
    ppid: int
    session: int
    start_ticks: int
    """Start time after boot, in clock ticks (field 22)."""
    rss_bytes: int
    alive: bool
    """Not a zombie (state Z) nor dead (X): a zombie holds no memory and cannot be killed."""


def _read_stat(pid: int) -> Proc | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except OSError:  # gone meanwhile, or no /proc
        return None
    fields = text.rsplit(")", 1)[-1].split()  # the name (field 2) may hold spaces and ')'
    try:
        return Proc(
            pid=pid,
            ppid=int(fields[1]),
            session=int(fields[3]),
            start_ticks=int(fields[19]),
            rss_bytes=int(fields[21]) * os.sysconf("SC_PAGE_SIZE"),
            alive=fields[0] not in ("Z", "X", "x"),
        )
    except (IndexError, ValueError):
        return None


def process_table() -> dict[int, Proc]:
    """Every process of the machine (empty where there is no /proc)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    procs = (_read_stat(int(name)) for name in names if name.isdigit())
    return {p.pid: p for p in procs if p is not None}


def start_ticks(pid: int) -> int | None:
    """When `pid` started (clock ticks after boot), None without /proc."""
    proc = _read_stat(pid)
    return proc.start_ticks if proc else None


def trace_processes(
    table: dict[int, Proc],
    *,
    child: int,
    child_start: int | None,
    parent: int,
    zombies: bool = False,
) -> list[Proc]:
    """The live processes (and the zombies too, with `zombies`) of the trace whose child is
    `child` (started at `child_start`), as the module docstring finds them: its session, its
    descendants, and the descendants of `parent` started after it (orphans the subreaper
    took). `parent` itself is never one."""

    def ancestors(proc: Proc) -> Iterator[Proc]:
        seen = set()
        while proc.ppid in table and proc.ppid not in seen:
            seen.add(proc.ppid)
            proc = table[proc.ppid]
            yield proc

    def belongs(proc: Proc) -> bool:
        if proc.pid == parent:
            return False
        if proc.pid == child or proc.session == child:
            return True
        for up in ancestors(proc):
            if up.pid == child:
                return True
            if up.pid == parent:
                return child_start is not None and proc.start_ticks >= child_start
        return False

    return [p for p in table.values() if (zombies or p.alive) and belongs(p)]


def resident_bytes(procs: list[Proc]) -> int:
    """The resident memory of `procs` together: each one's proportional set size (a page
    shared by n processes counts 1/n in each: forked workers do not count torch n times), or
    its resident set size where the kernel gives no smaps_rollup (before Linux 4.14).
    Source: man 5 proc (/proc/PID/smaps_rollup, Pss in kB)."""
    return sum(_pss_bytes(p.pid) or p.rss_bytes for p in procs)


def _pss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            for line in fh:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def kill_trace(child: int, child_start: int | None) -> None:
    """SIGKILL the trace's session and every process trace_processes finds, and reap the ones
    that are (or became, through the subreaper) this process's children, until none is left
    or KILL_GRACE_S passed; the child itself is left to its Popen to reap.

    A killed process's children reach the subreaper only once all its threads have exited
    (the kernel hands them to a live thread of the same process first), so a zombie of the
    trace whose parent is still one of the trace's is waited for, not left behind."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child, signal.SIGKILL)
    parent = os.getpid()
    deadline = time.monotonic() + KILL_GRACE_S
    while True:
        procs = trace_processes(
            process_table(), child=child, child_start=child_start, parent=parent, zombies=True
        )
        live = [p for p in procs if p.alive]
        for proc in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGKILL)
        ours = {p.pid for p in procs if not p.alive and p.ppid == parent and p.pid != child}
        left = ours - _reap(ours)
        of_the_trace = {p.pid for p in procs}
        pending = [p for p in procs if not p.alive and p.ppid != parent and p.ppid in of_the_trace]
        if not (live or left or pending) or time.monotonic() > deadline:
            return
        time.sleep(0.01)


def _reap(pids: set[int]) -> set[int]:
    """The pids of `pids` reaped now (ended children of this process; others are left)."""
    done = set()
    for pid in pids:
        try:
            reaped, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not ours (any more)
            done.add(pid)
            continue
        if reaped:
            done.add(pid)
    return done


def _prctl() -> Any:
    """libc's prctl, None where there is none (not Linux)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def subreaper() -> Iterator[bool]:
    """This process as a child subreaper for the duration (see the module docstring): True
    where it is one (Linux), False where prctl is missing. A process that already was one
    stays one."""
    prctl = _prctl()
    was = ctypes.c_int(0)
    if prctl is None or prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0) != 0:
        yield False
        return
    if not was.value and prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        yield False
        return
    try:
        yield True
    finally:
        if not was.value:
            prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def adopt_orphans() -> None:
    """This process as a child subreaper for the rest of its life (a trace child: its
    double-forked grandchildren stay its descendants); nothing where prctl is missing."""
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def parent_of(pid: int) -> int | None:
    """The parent of the live process `pid`, None where it is gone, a zombie, or unknown."""
    proc = _read_stat(pid)
    return proc.ppid if proc and proc.alive else None
