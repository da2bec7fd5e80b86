"""Computations in worker processes: a request past its time limit is stopped, not abandoned.

Each of `max_concurrent` slots owns one worker process (spawned, so that no lock of the server's
threads is inherited) that runs one computation at a time, sent over a pipe. A request waits at
most `timeout_s` for its answer; past that the worker is killed (its computation stops at once)
and the slot starts a fresh one for the next request. The price is a pickle round trip per
request (docs/serve.md, "Limits": about 0.1 ms of the server's CPU) and, after each kill, a
worker's start-up (imports, under a second, not counted in the next request's time limit). The
workers start with the server.

The server awaits an answer on its event loop (`Runner.call`: the pipe's descriptor watched by
the loop), never in a thread: a thread per request cost more than the HTTP layer itself (0.3 ms
of GIL hand-offs per request, measured in process). Requests wait for a slot in arrival order,
at most MAX_WAITING_PER_SLOT per slot and `timeout_s` (else Busy, 503); the loop callback that
reads an answer hands its worker the next waiting computation before the answer goes on.
`encoded` runs a work function and encodes its answer as the response's JSON bytes in the
worker, so the server only forwards them.

The work functions are module-level (a worker imports them by name) and return plain JSON
values; ValueError is the user's (422), anything else a server fault (500, logged).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import json
import multiprocessing
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from trainmem.report import estimate_report, jsonable
from trainmem.report._validate import precision_given
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


PRECISION_GIVEN_FIELD = "precision_given"
"""The field the server adds to a request's fields (never the body's: the request models forbid
unknown fields): whether the body named `precision`. A precision the body names is the user's
choice, refused on a GPU that lacks it (422) as `--precision` is on the command line; one left
out is the default, run as its fp16 counterpart on a GPU without bf16, with a warning
(report/_validate.py runnable_precision)."""


def with_precision_given(fields: dict[str, Any], body: Any) -> dict[str, Any]:
    """`fields` and PRECISION_GIVEN_FIELD: whether the pydantic `body` set `precision`
    (also part of the answers' key: the same fields answer differently)."""
    return {**fields, PRECISION_GIVEN_FIELD: "precision" in body.model_fields_set}


def _given_precision(function: Callable[..., Any]) -> Callable[..., Any]:
    """A work function whose `fields` may hold PRECISION_GIVEN_FIELD: popped, and
    PRECISION_GIVEN set from it while the function runs (in the worker process)."""

    @functools.wraps(function)  # the module's name for it: a worker finds it by that name
    def run(fields: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        fields = dict(fields)
        with precision_given(bool(fields.pop(PRECISION_GIVEN_FIELD, False))):
            return function(fields, *args, **kwargs)

    return run


@_given_precision
def estimate_work(fields: dict[str, Any]) -> dict[str, Any]:
    """`trainmem estimate --json`."""
    return jsonable(estimate_report(**fields))


@_given_precision
def fit_work(fields: dict[str, Any]) -> dict[str, Any]:
    """`trainmem fit --json`."""
    return jsonable(fit_report(**fields))


@_given_precision
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
    """One worker process, started on first use and after each kill; `job` is the computation
    it is running (None when idle or starting)."""

    def __init__(self, context: Any) -> None:
        self._context = context
        self._process: Any = None
        self.conn: Connection | None = None
        self.job: _Job | None = None
        self.fd = -1
        """The pipe's descriptor while `job` runs (watched by the event loop)."""

    @property
    def ready(self) -> bool:
        return self.conn is not None and self._process is not None and self._process.is_alive()

    def start(self) -> None:
        """Start the worker if it is not running; blocks until its imports are done (call it
        from a thread, never on the event loop)."""
        if self.ready:
            return
        self.stop()
        parent, child = self._context.Pipe()
        self._process = self._context.Process(
            target=_serve_forever, args=(child,), daemon=True, name="trainmem-serve-worker"
        )
        self._process.start()
        child.close()
        if not parent.poll(START_TIMEOUT_S):
            parent.close()
            self.stop()
            raise WorkerFault(f"a worker process did not start within {START_TIMEOUT_S} s")
        parent.recv()  # "ready"
        self.conn = parent

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def stop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self._process is not None and self._process.pid is not None:  # started
            if self._process.is_alive():
                self._process.kill()
            self._process.join(timeout=5)
        self._process = None


@dataclass(eq=False)
class _Job:
    """One computation: the message for the worker and the future its caller awaits."""

    message: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]
    answer: asyncio.Future[Any]
    timer: asyncio.TimerHandle | None = None
    """Its deadline: for a free slot while it waits, its time limit once it runs (both
    `timeout_s`)."""


MAX_WAITING_PER_SLOT = 32
"""Requests that may wait for a free slot, per slot; one more is shed at once with 503. A
request waits at most `timeout_s` (then 503 too): a line of 16 clients' requests is served, a
flood is refused without holding its bodies (at most 64 KiB each)."""


class Runner:
    """At most `max_concurrent` computations at once, each stopped after `timeout_s`.

    `call` is awaited on the server's event loop. Requests wait in arrival order; a worker's
    answer is read by a callback of the loop that hands the worker the next waiting computation
    at once, before the answer goes on to its request (waiting for the request's task instead
    left the worker idle behind the loop's other work: fewer answers per second under load)."""

    def __init__(
        self, *, max_concurrent: int, timeout_s: float, max_waiting: int | None = None
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self.slots = [_Slot(context) for _ in range(max_concurrent)]
        self._idle = list(self.slots)
        self._waiting: collections.deque[_Job] = collections.deque()
        self._starting: set[asyncio.Future[None]] = set()
        self._timeout_s = timeout_s
        self.max_waiting = MAX_WAITING_PER_SLOT * max_concurrent
        """Requests that may wait for a slot (MAX_WAITING_PER_SLOT per slot by default)."""
        if max_waiting is not None:
            self.max_waiting = max_waiting

    async def call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`function(*args, **kwargs)` in a worker; Busy when `max_waiting` requests wait
        already or no slot frees within `timeout_s`, WorkLimit past `timeout_s` of computing
        (the worker killed), WorkerFault if it dies; cancelled, the computation is stopped with
        its worker (no stale answer left in the pipe for the next request)."""
        if not self._idle and len(self._waiting) >= self.max_waiting:
            raise Busy(BUSY)
        loop = asyncio.get_running_loop()
        job = _Job((function, args, kwargs), loop.create_future())
        job.timer = loop.call_later(self._timeout_s, self._shed, job)
        self._waiting.append(job)
        self._dispatch()
        try:
            return await job.answer
        except asyncio.CancelledError:
            self._abandon(job)
            raise

    def _dispatch(self) -> None:
        """Waiting computations to idle slots, oldest first."""
        while self._waiting and self._idle:
            slot, job = self._idle.pop(), self._waiting.popleft()
            if job.timer is not None:
                job.timer.cancel()
            if slot.ready:
                self._run(slot, job)
            else:  # first use, or killed: start it in a thread (not counted in the time limit)
                task = asyncio.ensure_future(self._start_then_run(slot, job))
                self._starting.add(task)
                task.add_done_callback(self._starting.discard)

    async def _start_then_run(self, slot: _Slot, job: _Job) -> None:
        try:
            await asyncio.to_thread(slot.start)
        except Exception as error:  # noqa: BLE001 - the request gets a 500, logged
            slot.stop()
            self._idle.append(slot)
            if not job.answer.done():
                job.answer.set_exception(WorkerFault(f"a worker process did not start: {error}"))
            self._dispatch()
            return
        if job.answer.done():  # cancelled while the worker started
            self._idle.append(slot)
            self._dispatch()
            return
        self._run(slot, job)

    def _run(self, slot: _Slot, job: _Job) -> None:
        loop = asyncio.get_running_loop()
        assert slot.conn is not None
        slot.job = job
        try:
            slot.conn.send(job.message)
        except OSError:  # the worker died since (out of memory, killed)
            self._finish(slot, error=WorkerFault(DIED), kill=True)
            return
        slot.fd = slot.conn.fileno()
        loop.add_reader(slot.fd, self._answered, slot)
        job.timer = loop.call_later(self._timeout_s, self._time_out, slot)

    def _answered(self, slot: _Slot) -> None:
        """The worker's pipe is readable: its answer (it has started writing it), or its end."""
        assert slot.conn is not None
        try:
            status, payload = slot.conn.recv()
        except (EOFError, OSError):
            self._finish(slot, error=WorkerFault(DIED), kill=True)
            return
        if status == "ok":
            self._finish(slot, result=payload)
        elif status == "value":
            self._finish(slot, error=ValueError(payload))
        else:
            self._finish(slot, error=WorkerFault(payload))

    def _time_out(self, slot: _Slot) -> None:
        limit = f"work limit: the request took longer than {self._timeout_s:g} s; narrow it"
        self._finish(slot, error=WorkLimit(limit), kill=True)  # the computation dies with it

    def _finish(
        self,
        slot: _Slot,
        *,
        result: Any = None,
        error: BaseException | None = None,
        kill: bool = False,
    ) -> None:
        """End the slot's computation: the slot free again (its worker killed if `kill`), the
        next waiting computation handed to it, then the answer to its caller."""
        job, slot.job = slot.job, None
        assert job is not None
        if job.timer is not None:
            job.timer.cancel()
        if slot.fd >= 0:
            asyncio.get_running_loop().remove_reader(slot.fd)
            slot.fd = -1
        if kill:
            slot.stop()
        self._idle.append(slot)
        self._dispatch()
        if not job.answer.done():
            if error is not None:
                job.answer.set_exception(error)
            else:
                job.answer.set_result(result)

    def _shed(self, job: _Job) -> None:
        """`timeout_s` passed and no slot freed: Busy (503)."""
        if job in self._waiting:
            self._waiting.remove(job)
            if not job.answer.done():
                job.answer.set_exception(Busy(BUSY))

    def _abandon(self, job: _Job) -> None:
        """A cancelled caller: drop its computation, killing the worker that runs it."""
        if job in self._waiting:
            self._waiting.remove(job)
            if job.timer is not None:
                job.timer.cancel()
            return
        for slot in self.slots:
            if slot.job is job:
                self._finish(slot, kill=True)

    def start(self) -> None:
        """Start every worker now (the server's start-up, from a thread), not on the first
        requests."""
        for slot in self.slots:
            slot.start()

    def close(self) -> None:
        """Stop every worker (the server's shutdown)."""
        for slot in self.slots:
            slot.stop()


DIED = "the worker process died during the computation"
BUSY = "all computation slots are busy; retry shortly"


@_given_precision
def check_work(fields: dict[str, Any]) -> dict[str, Any]:
    """`trainmem check --json` of the files' texts in `fields["files"]` (a model name never
    reads a server file: local_paths False)."""
    from trainmem.stacks import check_report

    files = fields.pop("files")
    return jsonable(check_report(files, local_paths=False, **fields))
