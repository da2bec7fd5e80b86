"""Run one trace in a fresh process (see _fake_cuda.autograd_sees_fake_cuda): the parent calls
`run_in_child(function, kwargs)`; this module's main() reads {"function", "kwargs"} as JSON on
stdin and prints the result (or a one-line error) as JSON on stdout."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

FUNCTIONS = {
    "trace_step": ("trainmem.trace._core", "trace_step"),
    "trace_module": ("trainmem.trace._module", "trace_module"),
    "trace_parallel": ("trainmem.trace._dist", "trace_parallel"),
}


def run_in_child(function: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """function(**kwargs) in a fresh Python process; ValueErrors come back as ValueErrors."""
    proc = subprocess.run(
        [sys.executable, "-m", "trainmem.trace._child"],
        input=json.dumps({"function": function, "kwargs": kwargs}),
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"trace: the child process failed: {tail}") from None
    if "error" in answer:
        raise ValueError(answer["error"])
    return answer["result"]


def main() -> None:
    import importlib

    request = json.loads(sys.stdin.read())
    module_name, attr = FUNCTIONS[request["function"]]
    function = getattr(importlib.import_module(module_name), attr)
    try:
        result = function(**request["kwargs"])
    except ValueError as exc:
        print(json.dumps({"error": str(exc).splitlines()[0]}))
        return
    print(json.dumps({"result": result}))


if __name__ == "__main__":
    main()
