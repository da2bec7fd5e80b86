"""Computations in worker processes: a request past its time limit is stopped, not abandoned.

Each of `max_concurrent` slots owns one worker process (spawned, so that no lock of the server's
threads is inherited) that runs one computation at a time, sent over a pipe. A request waits at
most `timeout_s` for its answer; past that the worker is killed (its computation stops at once)
and the slot starts a fresh one for the next request. The price is a pickle round trip per
request (docs/serve.md, "Limits": about 0.1 ms) and, after each kill, a worker's start-up (imports,
under a second, not counted in the next request's time limit). The workers start with the server.

The server awaits an answer on its event loop (`Runner.call`: the pipe's descriptor watched by
the loop), never in a thread: a thread per request cost more than the HTTP layer itself (0.3 ms
of GIL hand-offs per request, measured in process). `encoded` runs a work function and encodes
its answer as the response's JSON bytes in the worker, so the server only forwards them.

The work functions are module-level (a worker imports them by name) and return plain JSON
values; ValueError is the user's (422), anything else a server fault (500, logged).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from trainmem.report import estimate_report, jsonable
from trainmem.sweep import fit_report

START_TIMEOUT_S = 120.0
"""A worker's start-up (spawn, imports): seconds on any machine, minutes on none."""


class WorkLimit(ValueError):
    """The request asks for more work than the server's limits allow (answered with 422)."""


class Busy(RuntimeError):
    """Every computation slot is taken (answered with 503 and Retry-After)."""


class WorkerFault(RuntimeError):
    """A computation failed with something other than ValueError (answered with 500, logged)."""


def json_bytes(value: Any) -> bytes:
    """`value` as a JSON response body: what starlette's JSONResponse renders (compact, UTF-8,
    no NaN: a non-finite float is a ValueError, as there)."""
    return json.dumps(
        value, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode("utf-8")


def encoded(function: Callable[..., Any], *args: Any, **kwargs: Any) -> bytes:
    """`function`'s answer as JSON bytes (`json_bytes`), encoded in the worker."""
    return json_bytes(function(*args, **kwargs))


def estimate_work(fields: dict[str, Any]) -> dict[str, Any]:
    """`trainmem estimate --json`."""
    return jsonable(estimate_report(**fields))


def fit_work(fields: dict[str, Any]) -> dict[str, Any]:
    """`trainmem fit --json`."""
    return jsonable(fit_report(**fields))


def recommend_work(
    fields: dict[str, Any], *, pools: list[dict[str, Any]], label: str, max_points: int
) -> dict[str, Any]:
    """`trainmem recommend --format json` on an inline fleet (`pools`, already validated).

    The pools go to the planner in memory, as the tables of a fleet file (`fleet_tables`): no
    file is written or read, so no name in a request can reach a file of the server. `label`
    (the request's fleet text) names the fleet in the answer and its errors.
    """
    from trainmem.plan import recommend_report, space_points

    fields = {**fields, "fleet": fleet_tables(pools), "fleet_label": label}
    points = space_points(**fields)
    if points > max_points:
        raise WorkLimit(
            f"work limit: recommend would search {points:,} points (limit "
            f"{max_points:,}); narrow fleet, max_pp, max_cp or max_micro_batch_size"
        )
    return {**jsonable(recommend_report(**fields)), "fleet": label}


def fleet_tables(pools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """[[pool]] tables (hardware/_fleet.py's format, as a fleet TOML file parses to) for
    validated pools."""
    tables = []
    for pool in pools:
        table = {
            "gpu": pool["gpu"],
            "nodes": int(pool["nodes"]),
            "gpus_per_node": int(pool["gpus_per_node"]),
        }
        if pool.get("price_per_hour_usd") is not None:
            table["price_per_hour_usd"] = float(pool["price_per_hour_usd"])
        tables.append(table)
    return tables


def _serve_forever(conn: Connection) -> None:
    """A worker's loop: (function, args, kwargs) in, ("ok" | "value" | "fault", payload) out;
    "ready" first, once the imports are done (a request's time limit counts computation only)."""
    conn.send("ready")
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        function, args, kwargs = message
        try:
            answer: tuple[str, Any] = ("ok", function(*args, **kwargs))
        except ValueError as error:
            answer = ("value", str(error))
        except Exception:  # noqa: BLE001 - reported to the server, which logs it
            answer = ("fault", traceback.format_exc())
        conn.send(answer)


class _Slot:
    """One worker process, started on first use and after each kill."""

    def __init__(self, context: Any) -> None:
        self._context = context
        self._process: Any = None
        self._conn: Connection | None = None

    @property
    def ready(self) -> bool:
        return self._conn is not None and self._process is not None and self._process.is_alive()

    def start(self) -> Connection:
        """The worker's pipe, starting the worker first if it is not running (blocks until its
        imports are done: call it from a thread, never on the event loop)."""
        if not self.ready:
            self.stop()
            parent, child = self._context.Pipe()
            self._process = self._context.Process(
                target=_serve_forever, args=(child,), daemon=True, name="trainmem-serve-worker"
            )
            self._process.start()
            child.close()
            if not parent.poll(START_TIMEOUT_S):
                self.stop()
                raise WorkerFault(f"a worker process did not start within {START_TIMEOUT_S} s")
            parent.recv()  # "ready"
            self._conn = parent
        assert self._conn is not None
        return self._conn

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def call(
        self, timeout_s: float, function: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """`function(*args, **kwargs)` in the worker, awaited on the running loop; past
        `timeout_s` (or if the caller is cancelled) the worker is killed, so that no stale
        answer is left in the pipe for the next request."""
        loop = asyncio.get_running_loop()
        conn = self._conn if self.ready else await asyncio.to_thread(self.start)
        assert conn is not None
        answered = loop.create_future()

        def readable() -> None:
            if not answered.done():
                answered.set_result(None)

        try:
            conn.send((function, args, kwargs))
            loop.add_reader(conn.fileno(), readable)
            try:
                await asyncio.wait_for(answered, timeout_s)
            finally:
                loop.remove_reader(conn.fileno())
            status, payload = conn.recv()  # readable: the worker has started writing it
        except asyncio.TimeoutError:
            self.stop()  # kills the computation with its process
            raise WorkLimit(
                f"work limit: the request took longer than {timeout_s:g} s; narrow it"
            ) from None
        except (EOFError, OSError):  # the worker died (out of memory, killed)
            self.stop()
            raise WorkerFault("the worker process died during the computation") from None
        except BaseException:  # cancelled: the computation's answer would reach the next request
            self.stop()
            raise
        if status == "value":
            raise ValueError(payload)
        if status == "fault":
            raise WorkerFault(payload)
        return payload

    def stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._process is not None and self._process.pid is not None:  # started
            if self._process.is_alive():
                self._process.kill()
            self._process.join(timeout=5)
        self._process = None


SLOT_WAIT_S = 1.0
"""How long a request waits for a free slot before it is shed with 503."""


class Runner:
    """At most `max_concurrent` computations at once, each stopped after `timeout_s`.

    `call` is awaited on the server's event loop (one loop: the free slots are an asyncio queue,
    bound to the loop that first waits on it)."""

    def __init__(self, *, max_concurrent: int, timeout_s: float) -> None:
        context = multiprocessing.get_context("spawn")
        self.slots = [_Slot(context) for _ in range(max_concurrent)]
        self._free: asyncio.Queue[_Slot] = asyncio.Queue()
        for slot in self.slots:
            self._free.put_nowait(slot)
        self._timeout_s = timeout_s

    async def call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`function(*args, **kwargs)` in a free worker; Busy when none frees within
        SLOT_WAIT_S, WorkLimit past `timeout_s`."""
        try:
            slot = await asyncio.wait_for(self._free.get(), SLOT_WAIT_S)
        except asyncio.TimeoutError:
            raise Busy("all computation slots are busy; retry shortly") from None
        try:
            return await slot.call(self._timeout_s, function, *args, **kwargs)
        finally:
            self._free.put_nowait(slot)

    def start(self) -> None:
        """Start every worker now (the server's start-up, from a thread), not on the first
        requests."""
        for slot in self.slots:
            slot.start()

    def close(self) -> None:
        """Stop every worker (the server's shutdown)."""
        for slot in self.slots:
            slot.stop()


def check_work(fields: dict[str, Any]) -> dict[str, Any]:
    """`trainmem check --json` of the files' texts in `fields["files"]` (a model name never
    reads a server file: local_paths False)."""
    from trainmem.stacks import check_report

    files = fields.pop("files")
    return jsonable(check_report(files, local_paths=False, **fields))
