"""Factories for `trainmem trace --module` that misbehave, for the bound tests
(tests/unit/trace/test_bounds.py): a forward that never returns, a factory that exits, one that
segfaults, one that leaves a detached grandchild behind, one that allocates real memory without
bound. A grandchild's pid goes to the file named by $TRAINMEM_TEST_PID_FILE.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time

import torch
from torch import nn

SLEEPER = "import time; time.sleep(600)"


class Tiny(nn.Module):
    def __init__(self, loop: bool = False) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.loop = loop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        while self.loop:  # a forward that never returns
            time.sleep(0.01)
        return self.linear(x)


def _batch() -> torch.Tensor:
    return torch.randn(2, 8)


def looping_forward() -> tuple[nn.Module, torch.Tensor]:
    return Tiny(loop=True), _batch()


def exits() -> tuple[nn.Module, torch.Tensor]:
    os._exit(7)


def segfaults() -> tuple[nn.Module, torch.Tensor]:
    ctypes.string_at(0)
    raise AssertionError("not reached")


def _write_pid(pid: int) -> None:
    with open(os.environ["TRAINMEM_TEST_PID_FILE"], "a") as fh:
        fh.write(f"{pid}\n")


def _daemon() -> None:
    """A grandchild that double-forks and leaves the session (setsid): init's, not ours."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            _write_pid(os.getpid())
            time.sleep(600)
        os._exit(0)


def detached_grandchildren() -> tuple[nn.Module, torch.Tensor]:
    """A normal module, after starting a sleeper in a new session and a double-forked daemon,
    and printing lines that look like the trace child's answer (they must not be taken for it)."""
    sleeper = subprocess.Popen([sys.executable, "-c", SLEEPER], start_new_session=True)
    _write_pid(sleeper.pid)
    _daemon()
    print('{"result": "a line that looks like the trace child\'s answer"}', flush=True)
    os.write(1, b'{"error": "and one written to fd 1"}\n')
    return Tiny(), _batch()


def detached_grandchildren_then_loop() -> tuple[nn.Module, torch.Tensor]:
    """The same grandchildren, then a forward that never returns (stopped at the timeout)."""
    detached_grandchildren()
    return looping_forward()


def memory_hog() -> tuple[nn.Module, torch.Tensor]:
    """Real memory (64 MiB blocks, every page written) until an allocation is refused."""
    held = []
    while True:
        held.append(bytearray(64 << 20))
