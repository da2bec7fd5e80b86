"""Run one trace in a fresh process (see _fake_cuda.autograd_sees_fake_cuda): the parent calls
`run_in_child(function, kwargs)`; this module's main() reads {"function", "kwargs"} as JSON on
stdin and prints the result (or a one-line error) as JSON on stdout.

One level only: the child runs with TRAINMEM_TRACE_CHILD=1 in its environment, and a process
with that marker never starts another child (run_in_child raises a one-line ValueError naming
the torch build instead). The child runs in its own process group, is killed with it after
TRAINMEM_TRACE_TIMEOUT seconds (default 1800), and may cap its own address space at
TRAINMEM_TRACE_MAX_MEMORY_GB (default: no cap; fake tensors take no memory, the model code and
torch do).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from typing import Any

FUNCTIONS = {
    "trace_step": ("trainmem.trace._core", "trace_step"),
    "trace_module": ("trainmem.trace._module", "trace_module"),
    "trace_parallel": ("trainmem.trace._dist", "trace_parallel"),
}
CHILD_MARKER = "TRAINMEM_TRACE_CHILD"
TIMEOUT_VARIABLE = "TRAINMEM_TRACE_TIMEOUT"
MEMORY_VARIABLE = "TRAINMEM_TRACE_MAX_MEMORY_GB"
DEFAULT_TIMEOUT_S = 1800.0


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


BOUNDS = {TIMEOUT_VARIABLE: (0.1, 7 * 86400.0, "seconds"), MEMORY_VARIABLE: (1.0, 65536.0, "GB")}
"""Allowed values of the bound variables (inclusive): a timeout of 0.1 s to a week, an address-
space cap of 1 GB (torch alone maps more) to 64 TB."""


def _positive_float(variable: str, default: float | None) -> float | None:
    """$variable as a number within BOUNDS, else a one-line ValueError naming it (0, -5, nan,
    inf, 1e309, abc and 0.001 GB are refused); `default` where it is unset."""
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return default
    lo, hi, unit = BOUNDS[variable]
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not lo <= value <= hi:  # nan and inf fail too
        raise ValueError(
            f"trace: {variable} must be a number of {unit} from {lo:g} to {hi:g}; got {raw!r}"
        )
    return value


def run_in_child(
    function: str,
    kwargs: dict[str, Any],
    *,
    timeout_s: float | None = None,
    command: list[str] | None = None,
) -> dict[str, Any]:
    """function(**kwargs) in a fresh Python process; ValueErrors come back as ValueErrors.

    timeout_s defaults to $TRAINMEM_TRACE_TIMEOUT or 30 minutes; `command` replaces the child's
    command line (tests)."""
    if is_child():
        raise no_second_child_error()
    if timeout_s is None:
        timeout_s = _positive_float(TIMEOUT_VARIABLE, DEFAULT_TIMEOUT_S)
    proc = subprocess.Popen(
        command or [sys.executable, "-m", "trainmem.trace._child"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, CHILD_MARKER: "1"},
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(
            json.dumps({"function": function, "kwargs": kwargs}), timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise ValueError(
            f"trace: the child process ran past {timeout_s:g} s and was stopped "
            f"(set {TIMEOUT_VARIABLE} to allow more)"
        ) from None
    except BaseException:  # KeyboardInterrupt: no orphan left behind
        _kill_group(proc)
        raise
    lines = stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise ValueError(_death_line(proc.returncode, stderr)) from None
    if "error" in answer:
        raise ValueError(answer["error"])
    return answer["result"]


def _death_line(returncode: int | None, stderr: str) -> str:
    """One line for a child that ended without an answer: killed by a signal (its name; SIGKILL
    is most often the kernel's OOM killer or the address-space cap), or an exit status (the
    model's code calling os._exit, a crash), with the last line it wrote on stderr."""
    tail = (stderr.strip().splitlines() or [""])[-1][:200]
    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name
        why = f"was killed by {name}"
        if name == "SIGKILL":
            why += f" (out of memory? {MEMORY_VARIABLE} caps its address space)"
    else:
        why = f"exited with status {returncode} before answering"
    return f"trace: the child process {why}" + (f": {tail}" if tail else "")


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Kill the child's process group (the child and anything it started), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.communicate()


def _cap_memory() -> None:
    gb = _positive_float(MEMORY_VARIABLE, None)
    if gb is None:
        return
    import resource

    limit = int(gb * 2**30)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def main() -> None:
    import importlib

    try:
        if not is_child():
            raise ValueError(f"trace: {__name__} runs only as a trace child ({CHILD_MARKER}=1)")
        _cap_memory()
        request = json.loads(sys.stdin.read())
        module_name, attr = FUNCTIONS[request["function"]]
        function = getattr(importlib.import_module(module_name), attr)
        result = function(**request["kwargs"])
    except ValueError as exc:
        print(json.dumps({"error": (str(exc).splitlines() or ["ValueError"])[0]}))
        return
    except MemoryError:
        gb = os.environ.get(MEMORY_VARIABLE, "")
        print(json.dumps({"error": f"trace: the child process ran out of memory ({gb} GB cap)"}))
        return
    print(json.dumps({"result": result}))


if __name__ == "__main__":
    main()
