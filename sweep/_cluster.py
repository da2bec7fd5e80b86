"""Where a search's parallel work runs (`--scheduler`): local processes (joblib's loky), or the
workers of a Dask cluster through joblib's dask backend on a `distributed.Client`.

The work is the same either way: an exhaustive search's chunks (each evaluated and written as
one part by whichever process runs it) or Optuna's workers; results come back in submission
order, so progress and the coordinator's publishing do not depend on where a chunk ran. Every
worker imports trainmem (the functions travel by name): each node runs the same version,
installed with the distributed extra (`pip install 'trainmem[distributed]'`).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import Any

LOCAL = "local"
"""--scheduler's value (and None's, and "") for this machine's processes (`--jobs`)."""
DASK_SCHEMES = ("tcp", "tls", "dask")
"""Scheduler address schemes: a Dask scheduler's tcp:// or tls:// (dask:// reads as tcp://)."""
ALLOWED = "local, tcp://HOST:PORT, tls://HOST:PORT, dask://HOST:PORT"
CONNECT_TIMEOUT_S = 10.0
"""How long a run waits for the scheduler to answer before its one-line error."""
MMAP_THRESHOLD_BYTES = 32 << 20
"""glibc's largest dynamic mmap threshold (64-bit), set on each worker (`tune_malloc`)."""
_ADDRESS = re.compile(r"^(?P<scheme>[a-z]+)://(?P<host>\[[0-9A-Fa-f:.]+\]|[^:/\s\[\]]+):\d+/?$")


def parse_scheduler(text: str | None) -> str | None:
    """The Dask scheduler address of --scheduler `text`, None for local processes (None, "",
    "local"); dask://HOST:PORT as tcp://HOST:PORT. ValueError naming --scheduler otherwise."""
    if text is None or text.strip() in ("", LOCAL):
        return None
    value = text.strip()
    match = _ADDRESS.match(value)
    if match is None or match["scheme"] not in DASK_SCHEMES:
        raise ValueError(f"scheduler: unknown value {value!r}; allowed: {ALLOWED}")
    scheme = "tcp" if match["scheme"] == "dask" else match["scheme"]
    return f"{scheme}://{value.split('://', 1)[1].rstrip('/')}"


@contextlib.contextmanager
def connect(address: str) -> Iterator[Any]:
    """A `distributed.Client` on the scheduler at `address`, closed on exit (the cluster keeps
    running). ValueError naming --scheduler when the extra is missing or nothing answers
    within CONNECT_TIMEOUT_S."""
    try:
        import distributed
    except ImportError:
        raise ValueError(
            "scheduler: a Dask cluster needs the distributed extra: "
            "pip install 'trainmem[distributed]'"
        ) from None
    try:
        client = distributed.Client(
            address, timeout=CONNECT_TIMEOUT_S, set_as_default=False, direct_to_workers=False
        )
    except (OSError, TimeoutError) as error:
        message = " ".join(str(error).split())[:160]
        raise ValueError(f"scheduler: cannot reach {address}: {message}") from None
    try:
        client.register_plugin(_malloc_plugin())
        yield client
    finally:
        client.close()


def tune_malloc() -> bool:
    """Give glibc's malloc the large-block thresholds its dynamic defaults reach (mmap
    MMAP_THRESHOLD_BYTES, trim twice that); True where it took them (glibc only).

    Dask's nanny starts its workers with MALLOC_TRIM_THRESHOLD_=65536, which fixes both low:
    every numpy temporary of a chunk is then mmapped and unmapped again, and a chunk takes
    twice as long (ten chunks of 100,000 points of the 405B space: 1.17 s against 0.56 s with
    these thresholds, one core here)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # glibc malloc.h
        ok = libc.mallopt(m_mmap_threshold, MMAP_THRESHOLD_BYTES)
        return bool(ok and libc.mallopt(m_trim_threshold, 2 * MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):  # not glibc
        return False


def _malloc_plugin() -> Any:
    """A worker plugin that runs `tune_malloc` on every worker, present and future."""
    from distributed import WorkerPlugin

    class TuneMalloc(WorkerPlugin):  # type: ignore[misc]
        name = "trainmem-tune-malloc"

        def setup(self, worker: Any) -> None:
            tune_malloc()

    return TuneMalloc()


@contextlib.contextmanager
def executor(
    scheduler: str | None, *, n_jobs: int, batch_size: int | str = "auto"
) -> Iterator[Any]:
    """A joblib Parallel whose call gives each delayed call's result, in order, as a generator:
    `n_jobs` local loky processes (`scheduler` None) or the cluster's workers (all their
    threads) through joblib's dask backend, on a client connected on entry (an unreachable
    scheduler fails before any work) and closed on exit. `batch_size`: calls per task (joblib's;
    1 for long-running calls that must run side by side)."""
    from joblib import Parallel, parallel_config

    if scheduler is None:
        from joblib._parallel_backends import LokyBackend

        backend = LokyBackend(initializer=watch_parent, initargs=(os.getpid(),))
        yield Parallel(n_jobs=n_jobs, backend=backend, return_as="generator", batch_size=batch_size)
        return
    with connect(scheduler) as client:
        # The backend is bound when Parallel is built: it keeps this client after the block.
        with parallel_config(backend="dask", client=client, wait_for_workers_timeout=60):
            parallel = Parallel(n_jobs=-1, return_as="generator", batch_size=batch_size)
        yield parallel


PARENT_POLL_S = 0.5
"""How often a local worker process checks that the sweep that started it still runs."""


def watch_parent(parent_pid: int) -> None:
    """A local worker's initializer: end this process (os._exit) once the process that
    started it is gone, checked every PARENT_POLL_S by a daemon thread (a worker whose parent
    was SIGKILLed is re-parented: its os.getppid() changes). Without it joblib's loky workers
    outlive a killed sweep by minutes (their idle timeout), ~270 MB each.

    A thread rather than prctl(PR_SET_PDEATHSIG): that signal follows the parent *thread*
    that spawned the worker (loky respawns workers from its manager thread), and it is Linux
    only; polling getppid is POSIX and costs nothing."""
    import threading
    import time

    parent = os.getppid()
    if parent != parent_pid and parent == 1:  # the sweep died before this worker started
        os._exit(1)

    def _watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=_watch, name="trainmem-parent-watch", daemon=True).start()


def shared_out(out: str | os.PathLike[str] | None, scheduler: str | None) -> Any:
    """`out` as every worker must see it: an absolute path when a cluster writes it (a worker's
    working folder is its own), a URL as given."""
    if out is None or scheduler is None:
        return out
    from trainmem.results._store import is_url, local_path

    return os.fspath(out) if is_url(out) else str(local_path(out).absolute())


def check_cluster_storage(storage: str | None) -> None:
    """ValueError naming --scheduler unless `storage` is a database server's URL: Optuna
    workers on a cluster's nodes share their study through it (not an SQLite file, not one
    process's memory)."""
    if storage is None or storage == ":memory:" or storage.startswith("sqlite:"):
        raise ValueError(
            "scheduler: Optuna workers on a cluster share the study through a database "
            "server: give --storage postgresql://... or mysql://... (got "
            f"{storage or 'no --storage'})"
        )
