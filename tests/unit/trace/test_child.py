"""The trace child process: one level only, a timeout, a one-line error naming the torch build.

A process whose autograd engine started before the fake `cuda` device existed traces in a fresh
child (trace/_child.py). A child never starts another one: where even a fresh process cannot run
backward on the fake device it fails in one line. The timeout tests need no torch; the rest skip
only where torch (the trace extra) is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest

from trainmem.trace import _child


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie, killed and not yet reaped by init, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def test_a_hanging_child_is_killed_with_its_process_group_at_the_timeout(tmp_path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    # The child starts a grandchild (as a compile step would) and both hang.
    script = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)"
    )
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"exceeded timeout_s 1 s and was stopped") as info:
        _child.run_in_child("trace_step", {}, timeout_s=1.0, command=[sys.executable, "-c", script])
    assert time.monotonic() - start < 30
    assert "\n" not in str(info.value) and "TRAINMEM_TRACE_TIMEOUT" in str(info.value)
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_the_timeout_comes_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(_child.TIMEOUT_VARIABLE, "0.5")
    command = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(ValueError, match=r"exceeded TRAINMEM_TRACE_TIMEOUT 0.5 s"):
        _child.run_in_child("trace_step", {}, command=command)
    monkeypatch.setenv(_child.TIMEOUT_VARIABLE, "soon")
    with pytest.raises(ValueError, match="TRAINMEM_TRACE_TIMEOUT must be a number of seconds"):
        _child.run_in_child("trace_step", {}, command=command)


def test_the_child_gets_the_marker_and_the_memory_cap(monkeypatch) -> None:
    monkeypatch.setenv(_child.MEMORY_VARIABLE, "64")
    script = (
        "import json, os, resource; from trainmem.trace._child import _cap_memory; _cap_memory(); "
        "print(json.dumps({'result': [os.environ.get('TRAINMEM_TRACE_CHILD'), "
        "resource.getrlimit(resource.RLIMIT_AS)[0]]}))"
    )
    marker, limit = _child.run_in_child("trace_step", {}, command=[sys.executable, "-c", script])
    assert marker == "1"
    import resource

    hard = resource.getrlimit(resource.RLIMIT_AS)[1]  # a cap set from outside stays the bound
    assert limit == (64 * 2**30 if hard == resource.RLIM_INFINITY else min(64 * 2**30, hard))


def test_the_child_entry_runs_only_as_a_child() -> None:
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != _child.CHILD_MARKER}
    proc = subprocess.run(
        [sys.executable, "-m", "trainmem.trace._child"],
        input="{}",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "runs only as a trace child" in json.loads(proc.stdout.strip().splitlines()[-1])["error"]


needs_torch = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("torch", "transformers")),
    reason="trainmem[trace] not installed: pip install 'trainmem[trace]'",
)
TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 128,
}
FLAGS = {
    "micro_batch_size": 1,
    "seq_len": 16,
    "precision": "bf16",
    "recompute": "none",
    "attention": "flash",
    "optimizer": "adamw",
}


@needs_torch
def test_a_child_that_would_need_a_child_fails_in_one_line_instead(monkeypatch) -> None:
    """In a child, a fake device autograd cannot use is an error naming the torch build: no
    process is started (Popen would fail the test)."""
    import subprocess

    import torch

    from trainmem.trace import _fake_cuda
    from trainmem.trace._core import trace_step

    monkeypatch.setenv(_child.CHILD_MARKER, "1")
    monkeypatch.setattr(_fake_cuda, "_library", lambda: (None, ""))  # the device is "there"
    monkeypatch.setattr(_fake_cuda, "autograd_failure", lambda: "RuntimeError: test")

    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a trace child started a process: {args}")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    with pytest.raises(ValueError, match="cannot run backward even in a fresh process") as info:
        trace_step(TINY_LLAMA, **FLAGS)
    message = str(info.value)
    assert "\n" not in message
    assert f"torch {torch.__version__}" in message and "RuntimeError: test" in message
    assert "--device cpu" in message
    # run_in_child itself refuses too (every path that starts a child goes through it)
    with pytest.raises(ValueError, match="even in a fresh process"):
        _child.run_in_child("trace_step", {"config": TINY_LLAMA, **FLAGS})


@needs_torch
def test_a_real_child_whose_autograd_started_first_fails_fast_without_a_grandchild() -> None:
    """The real child entry, in a process whose autograd engine ran before the fake device
    existed (what a CUDA build of torch without a GPU did before it was supported: the chain of
    the issue): it answers with the one-line error and starts no process of its own."""
    from trainmem.trace._fake_cuda import fake_cuda_unavailable_reason

    if fake_cuda_unavailable_reason():
        pytest.skip(f"no fake CUDA device here: {fake_cuda_unavailable_reason()}")
    script = "\n".join(
        [
            "import subprocess, torch",
            "x = torch.ones(2, requires_grad=True); (x * 2).sum().backward()",
            "plain = subprocess.Popen",
            "def popen(args, **kwargs):",  # the extension's build may run ninja; no trace child
            "    assert 'trainmem.trace._child' not in str(args), 'the child started a child'",
            "    return plain(args, **kwargs)",
            "subprocess.Popen = popen",
            "from trainmem.trace._child import main; main()",
        ]
    )
    start = time.monotonic()
    with pytest.raises(ValueError, match="cannot run backward even in a fresh process") as info:
        _child.run_in_child(
            "trace_step",
            {"config": TINY_LLAMA, **FLAGS},
            timeout_s=120,
            command=[sys.executable, "-c", script],
        )
    assert time.monotonic() - start < 120
    message = str(info.value)
    assert "\n" not in message and "torch 2." in message and "INTERNAL ASSERT" in message


@needs_torch
def test_a_process_whose_autograd_started_first_traces_in_one_child(tmp_path) -> None:
    """The parent half: autograd ran here first, so the CLI traces in exactly one child (whose
    own autograd starts after the fake device) and the result comes back."""
    import subprocess

    from trainmem.trace._fake_cuda import fake_cuda_unavailable_reason

    if fake_cuda_unavailable_reason():
        pytest.skip(f"no fake CUDA device here: {fake_cuda_unavailable_reason()}")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_LLAMA))
    script = (
        "import subprocess, sys, torch; "
        "x = torch.ones(2, requires_grad=True); (x * 2).sum().backward(); "
        "plain = subprocess.Popen; children = []; "
        "subprocess.Popen = lambda args, **k: children.append(args) or plain(args, **k); "
        "from trainmem.cli import main; "
        f"code = main(['trace', '--model', {str(config)!r}, '--seq-len', '16', '--json']); "
        "print('children', sum('trainmem.trace._child' in a for a in children), file=sys.stderr); "
        "sys.exit(code)"
    )
    env = {k: v for k, v in os.environ.items() if k != _child.CHILD_MARKER}
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["measured"]["device"] == "cuda (fake)"
    assert proc.stderr.strip().splitlines()[-1] == "children 1"


@pytest.mark.parametrize("raw", ["0", "-5", "nan", "inf", "1e309", "abc"])
def test_meaningless_bounds_are_refused_naming_the_variable(monkeypatch, raw: str) -> None:
    for variable in (_child.TIMEOUT_VARIABLE, _child.MEMORY_VARIABLE):
        monkeypatch.setenv(variable, raw)
        with pytest.raises(ValueError, match=f"{variable} must be a number of"):
            _child._positive_float(variable, None)
    monkeypatch.setenv(_child.MEMORY_VARIABLE, "0.001")  # below what torch alone maps
    with pytest.raises(ValueError, match="from 1 to 65536"):
        _child._positive_float(_child.MEMORY_VARIABLE, None)


@pytest.mark.parametrize(
    ("code", "words"),
    [
        ("import os; os._exit(7)", "exited with status 7"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "killed by SIGSEGV"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "out of memory?"),
    ],
)
def test_a_child_that_dies_gets_one_line(code: str, words: str) -> None:
    # A model factory that calls os._exit, segfaults or is OOM-killed: one ValueError line.
    with pytest.raises(ValueError, match=words) as caught:
        _child.run_in_child("trace_step", {}, command=[sys.executable, "-c", code])
    assert "\n" not in str(caught.value)
