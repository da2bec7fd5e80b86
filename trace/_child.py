"""Run one trace in a fresh, bounded process: the parent calls `run_in_child(function, kwargs)`;
this module's main() reads {"function", "kwargs"} as JSON on stdin and prints the result (or a
one-line error) as JSON on stdout.

Who uses it: `trainmem trace` always (trace_report runs whole in one child, so that a model
whose forward loops, whose memory grows without bound, or which calls os._exit or segfaults
ends in one `error:` line, not with trainmem); the Python API where the caller does not ask for
in_process, and where this process's autograd engine started before the fake cuda device
existed (see _fake_cuda.autograd_sees_fake_cuda).

Bounds (`Bounds`, from --timeout / --max-memory-gb, else TRAINMEM_TRACE_TIMEOUT /
TRAINMEM_TRACE_MAX_MEMORY_GB, else 1800 s and no cap): the child runs in its own session; at the
timeout, over the memory cap, and whenever the trace ends, every process of the trace is killed,
grandchildren that left the session included (trace/_procs.py: this process is the child
subreaper meanwhile), and when trainmem ends from outside: SIGTERM or SIGHUP kill the trace on
the way out, a SIGKILL is seen by the child's watchdog, which then kills the trace's processes.
The memory cap is each process's address space (RLIMIT_AS, set in the child and inherited
by what it starts; not with --real-gpu, whose CUDA context maps more address space than memory)
and the resident memory of all the trace's processes together, read every MEMORY_POLL_S
seconds.

The child's stdout and stderr go to anonymous temporary files, not pipes, so that a grandchild
that keeps them open cannot keep the parent waiting; the child writes its answer on its own
copy of stdout and points fd 1 at stderr while the model runs, so a model's prints do not mix
with it.

One level only: the child runs with TRAINMEM_TRACE_CHILD=1 in its environment, and a process
with that marker never starts another child (run_in_child raises a one-line ValueError naming
the torch build instead).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import IO, Any

from ._bounds import (  # the variables' names, re-exported: tests and callers read them here
    GB,
    MEMORY_VARIABLE,
    Bounds,
    _positive_float,
    memory_line,
    resolve_bounds,
    timeout_line,
)
from ._bounds import TIMEOUT_VARIABLE as TIMEOUT_VARIABLE
from ._procs import (
    adopt_orphans,
    kill_trace,
    parent_of,
    process_table,
    resident_bytes,
    start_ticks,
    subreaper,
)
from ._procs import trace_processes as _trace_processes

FUNCTIONS = {
    "trace_report": ("trainmem.trace._report", "trace_report"),
    "trace_step": ("trainmem.trace._core", "trace_step"),
    "trace_module": ("trainmem.trace._module", "trace_module"),
    "trace_parallel": ("trainmem.trace._dist", "trace_parallel"),
}
CHILD_MARKER = "TRAINMEM_TRACE_CHILD"
POLL_S = 0.05
"""How often the parent looks at the child: its end, the clock, and (with a memory cap) the
resident memory of the trace's processes (one read of /proc; a few ms)."""
MEMORY_POLL_S = 0.2
ANSWER_CAP_BYTES = 256 << 20
"""The most of the child's stdout read back (a report is tens of KiB)."""
TAIL_BYTES = 64 << 10
"""The end of the child's stderr read for the line a dead child's error quotes."""


def is_child() -> bool:
    """Whether this process is a trace child (it must not start another)."""
    return os.environ.get(CHILD_MARKER) == "1"


def no_second_child_error() -> ValueError:
    """The one-line error of a child that would need a fresh process again."""
    from ._fake_cuda import autograd_failure, torch_build

    failure = autograd_failure() or "its autograd engine started before the device existed"
    return ValueError(
        f"trace: the fake cuda device cannot run backward even in a fresh process ({failure}) "
        f"with {torch_build()}; it needs a torch whose CUDA device guard and hooks trainmem can "
        "replace (CPU builds, CUDA builds without a GPU; 2.13 and 2.14 tested): run with "
        "--device cpu, or install a CPU build of torch"
    )


def run_in_child(
    function: str,
    kwargs: dict[str, Any],
    *,
    timeout_s: float | None = None,
    bounds: Bounds | None = None,
    command: list[str] | None = None,
) -> dict[str, Any]:
    """function(**kwargs) in a fresh, bounded Python process (the module docstring);
    ValueErrors come back as ValueErrors, and every other end (the timeout, the memory cap, a
    signal, an exit without an answer) as one ValueError line naming it.

    `bounds` defaults to resolve_bounds(timeout_s) (the variables' values, or 30 minutes and
    no memory cap); `command` replaces the child's command line (tests)."""
    if is_child():
        raise no_second_child_error()
    if bounds is None:
        bounds = resolve_bounds(timeout_s, timeout_name="timeout_s")
    env = {**os.environ, CHILD_MARKER: "1"}
    env.pop(MEMORY_VARIABLE, None)
    if bounds.max_memory_gb is not None:
        env[MEMORY_VARIABLE] = repr(bounds.max_memory_gb)
    request = json.dumps({"function": function, "kwargs": kwargs}).encode()
    with contextlib.ExitStack() as stack:
        stdin, stdout, stderr = (stack.enter_context(tempfile.TemporaryFile()) for _ in range(3))
        stdin.write(request)
        stdin.seek(0)
        with subreaper(), _termination_as_exception():
            failure, returncode = _run_watched(
                command or [sys.executable, "-m", "trainmem.trace._child"],
                env=env,
                bounds=bounds,
                files=(stdin, stdout, stderr),
            )
        if failure:
            raise ValueError(failure)
        answer = _answer(stdout)
        if answer is None:
            raise ValueError(_death_line(returncode, _tail(stderr), bounds))
    if "memory_error" in answer:
        what = f"an allocation failed ({answer['memory_error']})"
        if bounds.max_memory_gb is None:
            raise ValueError(f"trace: the child process ran out of memory: {what}")
        raise ValueError(memory_line(bounds, what))
    if "error" in answer:
        raise ValueError(answer["error"])
    return answer["result"]


class _Terminated(BaseException):
    """SIGTERM or SIGHUP while a trace child runs: raised so that the trace is killed on the
    way out, then the signal is delivered again with its own handler."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _termination_as_exception() -> Iterator[None]:
    """SIGTERM and SIGHUP (a scheduler ending trainmem, a closed terminal) as _Terminated for
    the duration, so that no process of the trace outlives trainmem; the signal is re-raised
    after. Only in the main thread (where Python runs signal handlers); elsewhere nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    numbers = (signal.SIGTERM, signal.SIGHUP)

    def stop(signum: int, frame: object) -> None:
        raise _Terminated(signum)

    # an ignored signal stays ignored (nohup ignores SIGHUP)
    saved = {n: signal.signal(n, stop) for n in numbers if signal.getsignal(n) != signal.SIG_IGN}
    try:
        yield
    except _Terminated as ended:
        for n, handler in saved.items():
            signal.signal(n, handler)
        saved = {}
        os.kill(os.getpid(), ended.signum)  # its own handler now: the default ends us
        raise KeyboardInterrupt from None  # a handler that returned: end as an interrupt
    finally:
        for n, handler in saved.items():
            signal.signal(n, handler)


def _run_watched(
    command: list[str], *, env: dict[str, str], bounds: Bounds, files: tuple[IO[bytes], ...]
) -> tuple[str, int | None]:
    """Start the child, watch it (its end, the timeout, the memory cap), then kill whatever is
    left of the trace and reap the child: ('', its exit status) when it ended by itself, else
    (the error line, None)."""
    stdin, stdout, stderr = files
    try:
        proc = subprocess.Popen(
            command, stdin=stdin, stdout=stdout, stderr=stderr, env=env, start_new_session=True
        )
    except OSError as exc:  # no process left (EAGAIN), no memory, a missing interpreter
        return f"trace: could not start the child process: {exc.strerror or exc}", None
    child_start = start_ticks(proc.pid)
    try:
        failure = _watch(proc, child_start, bounds)
    finally:  # KeyboardInterrupt included: no process of the trace outlives it
        kill_trace(proc.pid, child_start)
        proc.wait()
    return failure, None if failure else proc.returncode


def _watch(proc: subprocess.Popen[bytes], child_start: int | None, bounds: Bounds) -> str:
    """Wait for the child to end without reaping it (its pid stays its session's while
    kill_trace runs): '' when it ended, else the error line of the bound it passed."""
    deadline = time.monotonic() + bounds.timeout_s
    cap_bytes = None if bounds.max_memory_gb is None else bounds.max_memory_gb * GB
    next_memory_check = 0.0
    me = os.getpid()
    while not _ended(proc):
        now = time.monotonic()
        if now >= deadline:
            return timeout_line(bounds)
        if cap_bytes is not None and now >= next_memory_check:
            procs = _trace_processes(
                process_table(), child=proc.pid, child_start=child_start, parent=me
            )
            held = resident_bytes(procs)
            if held > cap_bytes:
                return memory_line(
                    bounds, f"its {len(procs)} processes held {held / GB:.2f} GB resident"
                )
            next_memory_check = now + MEMORY_POLL_S
        time.sleep(min(POLL_S, max(deadline - now, 0.0)))
    return ""


def _ended(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the child has ended, leaving it unreaped where waitid can (Linux)."""
    waitid = getattr(os, "waitid", None)
    if waitid is None:  # pragma: no cover - macOS: reaped here, its pid may be reused
        return proc.poll() is not None
    try:
        return waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _answer(stdout: IO[bytes]) -> dict[str, Any] | None:
    """The child's answer, the last line of its stdout; None where it wrote none."""
    stdout.seek(0)
    lines = stdout.read(ANSWER_CAP_BYTES).decode("utf-8", "replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return None
    if not isinstance(answer, dict) or not {"result", "error", "memory_error"} & set(answer):
        return None
    return answer


def _tail(stderr: IO[bytes]) -> str:
    """The end of the child's stderr (at most TAIL_BYTES)."""
    size = stderr.seek(0, os.SEEK_END)
    stderr.seek(max(size - TAIL_BYTES, 0))
    return stderr.read().decode("utf-8", "replace")


def _death_line(returncode: int | None, stderr: str, bounds: Bounds | None = None) -> str:
    """One line for a child that ended without an answer: killed by a signal (its name; SIGKILL
    is most often the kernel's OOM killer), or an exit status (the model's code calling
    os._exit or sys.exit, a crash), with the last line it wrote on stderr."""
    tail = (stderr.strip().splitlines() or [""])[-1][:200]
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        why = f"was killed by {name}"
        if name == "SIGKILL":
            cap = bounds.memory_label if bounds and bounds.max_memory_gb else ""
            why += (
                f" (out of memory? the kernel's OOM killer, under {cap})"
                if cap
                else f" (out of memory? --max-memory-gb or {MEMORY_VARIABLE} caps it)"
            )
        elif name in ("SIGSEGV", "SIGBUS", "SIGABRT"):
            why += " (a crash in native code: the model's, an extension's or torch's)"
    else:
        why = f"exited with status {returncode} before answering (os._exit or sys.exit?)"
    return f"trace: the child process {why}" + (f": {tail}" if tail else "")


def _cap_memory(address_space: bool = True) -> None:
    """RLIMIT_AS at $TRAINMEM_TRACE_MAX_MEMORY_GB (the parent sets it from the bounds), below
    a hard limit set from outside; nothing where unset or not `address_space`."""
    gb = _positive_float(MEMORY_VARIABLE, None)
    if gb is None or not address_space:
        return
    import resource

    limit = int(gb * GB)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


ALLOCATION_FAILURES = (
    "can't allocate memory",  # torch's DefaultCPUAllocator
    "Cannot allocate memory",  # ENOMEM
    "failed to map segment",  # a library loaded past RLIMIT_AS
    "std::bad_alloc",
    "MemoryError",  # as a model's failure names it (trace/_module.py)
)


def _allocation_failure(exc: BaseException) -> bool:
    """Whether `exc` is an allocation refused (MemoryError, or torch's / the loader's words)."""
    text = str(exc)
    return isinstance(exc, MemoryError) or any(words in text for words in ALLOCATION_FAILURES)


def _plain(value: Any) -> Any:
    """A numpy scalar or array as JSON can write it (json.dumps' default)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"[:300]


WATCH_S = 0.2
"""How often the watchdog looks for trainmem's death."""


def _start_watchdog() -> None:
    """End every process of the trace when trainmem dies without killing them (a SIGKILL,
    which it cannot see): this child becomes a subreaper (a double-forked grandchild stays its
    descendant) and forks, before torch starts a thread, a watchdog process that sees the
    child's parent change and kills the child's session and descendants, the child last. The
    watchdog leaves when the child ends (trainmem kills the rest then) and is itself one of the
    trace's processes, killed with them. Linux only (it reads /proc)."""
    child, parent = os.getpid(), os.getppid()
    adopt_orphans()
    if parent_of(child) != parent or not hasattr(os, "fork"):  # no /proc (not Linux): none
        return
    if os.fork() != 0:
        return
    try:
        while os.getppid() == child:
            time.sleep(WATCH_S)
            if parent_of(child) != parent:
                procs = _trace_processes(process_table(), child=child, child_start=None, parent=-1)
                for proc in sorted(procs, key=lambda p: p.pid == child):  # the child last
                    if proc.pid != os.getpid():
                        with contextlib.suppress(OSError):
                            os.kill(proc.pid, signal.SIGKILL)
                break
    finally:
        os._exit(0)  # no Python clean-up of the child's state in this copy


def main() -> None:
    """The child: the answer on its own copy of stdout, fd 1 pointed at stderr meanwhile."""
    import importlib

    if is_child():
        _start_watchdog()
    sys.stdout.flush()
    answer_fd = os.dup(1)  # not inherited by what the model starts (O_CLOEXEC)
    os.dup2(2, 1)
    capped = False
    try:
        if not is_child():
            raise ValueError(f"trace: {__name__} runs only as a trace child ({CHILD_MARKER}=1)")
        request = json.loads(sys.stdin.read())
        kwargs = request["kwargs"]
        capped = _positive_float(MEMORY_VARIABLE, None) is not None
        _cap_memory(address_space=not kwargs.get("real_gpu"))
        module_name, attr = FUNCTIONS[request["function"]]
        function = getattr(importlib.import_module(module_name), attr)
        answer: dict[str, Any] = {"result": function(**kwargs)}
    except ValueError as exc:  # a model's failure comes as one (_module.py): its memory too
        first = (str(exc).splitlines() or ["ValueError"])[0]
        answer = {"memory_error" if capped and _allocation_failure(exc) else "error": first}
    except Exception as exc:  # whatever the model raised: one line
        if isinstance(exc, MemoryError) or (capped and _allocation_failure(exc)):
            answer = {"memory_error": _one_line(exc)}
        else:
            answer = {"error": f"trace: the child process failed: {_one_line(exc)}"}
    try:
        text = json.dumps(answer, default=_plain)
    except (TypeError, ValueError) as exc:
        text = json.dumps({"error": f"trace: the child's answer is not JSON: {_one_line(exc)}"})
    with os.fdopen(answer_fd, "w") as out:
        out.write(text + "\n")


if __name__ == "__main__":
    main()
