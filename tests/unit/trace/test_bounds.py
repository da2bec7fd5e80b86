"""`trainmem trace` runs under a real bound (issue 31 item 3): always in one child process, ended
with every process the model started (grandchildren that left its session or double-forked
included) at --timeout, over --max-memory-gb, and whenever the trace ends; every other end (a
signal, os._exit) is one `error:` line, exit 2 (docs/exit-codes.md).

The process-tree tests run plain Python children (no torch, well under a second each); the
end-to-end ones run the real trace child on the hostile factories of
tests/data/trace_modules/hostile.py (a torch import each: a few seconds) and skip without torch.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainmem.cli import main
from trainmem.trace import _child, _procs

HOSTILE = Path(__file__).resolve().parents[2] / "data" / "trace_modules" / "hostile.py"
PID_FILE_VARIABLE = "TRAINMEM_TEST_PID_FILE"


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie, killed and not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _my_zombies() -> list[int]:
    """This process's children left unreaped (a kill that forgot to wait)."""
    me = os.getpid()
    table = _procs.process_table()
    return [p.pid for p in table.values() if p.ppid == me and not p.alive]


def _wait_for(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="no /proc here")

# A child that leaves three sleepers behind: one in its session, one in a session of its own
# (setsid), one double-forked out of its parentage (reparented to the subreaper); each pid is
# written to argv[1]; then it answers (or, with argv[2] == "hang", hangs).
LEAVES_SLEEPERS = r"""
import json, os, subprocess, sys, time
pids = open(sys.argv[1], "a")
sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
for new_session in (False, True):
    p = subprocess.Popen(sleep, start_new_session=new_session)
    pids.write(f"{p.pid}\n")
pids.flush()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        pids.write(f"{os.getpid()}\n"); pids.close()
        time.sleep(600)
    os._exit(0)
os.wait()
time.sleep(0.2)
if sys.argv[2] == "hang":
    time.sleep(600)
print(json.dumps({"result": "answered"}))
"""


@needs_proc
@pytest.mark.parametrize("ending", ["answer", "hang"])
def test_no_process_of_the_trace_outlives_it(tmp_path: Path, ending: str) -> None:
    pid_file = tmp_path / "pids"
    command = [sys.executable, "-c", LEAVES_SLEEPERS, str(pid_file), ending]
    bounds = _child.resolve_bounds("3" if ending == "hang" else "60", None)
    start = time.monotonic()
    if ending == "answer":
        # the sleepers hold the child's stdout and stderr open: no wait for them
        assert _child.run_in_child("trace_step", {}, bounds=bounds, command=command) == "answered"
    else:
        with pytest.raises(ValueError, match=r"^trace exceeded --timeout 3 s and was stopped"):
            _child.run_in_child("trace_step", {}, bounds=bounds, command=command)
    assert time.monotonic() - start < 30
    pids = _pids(pid_file)
    assert len(pids) == 3
    assert not [pid for pid in pids if _alive(pid)]  # killed at once: no waiting needed
    assert not _my_zombies()


@needs_proc
def test_the_memory_cap_counts_every_process_of_the_trace(tmp_path: Path) -> None:
    """Two processes of 0.7 GB each: neither passes 1 GB alone (nor would an address-space cap
    of its own), together they do; both are stopped in one line naming the flag."""
    hog = "b = bytearray(700 << 20); import time; time.sleep(600)"
    script = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {hog!r}], start_new_session=True); "
        f"exec({hog!r})"
    )
    bounds = _child.resolve_bounds("60", "1")
    start = time.monotonic()
    with pytest.raises(ValueError) as info:
        _child.run_in_child("trace_step", {}, bounds=bounds, command=[sys.executable, "-c", script])
    message = str(info.value)
    assert message.startswith("trace exceeded --max-memory-gb 1 GB: its 2 processes held")
    assert "\n" not in message and time.monotonic() - start < 30
    assert not _my_zombies()


@pytest.mark.parametrize("raw", ["0", "-5", "nan", "inf", "1e309", "abc", "", " ", True])
def test_bound_flags_are_refused_in_one_line_naming_the_flag_and_range(raw: object) -> None:
    # an empty flag is a value too (not "unset"), and True is no number of seconds
    with pytest.raises(ValueError, match=r"^--timeout: must be a number of seconds from 0.1 to "):
        _child.resolve_bounds(raw, None)
    with pytest.raises(ValueError, match=r"^--max-memory-gb: must be a number of GB from 1 to "):
        _child.resolve_bounds(None, raw)
    with pytest.raises(ValueError, match=r"^--max-memory-gb: .* from 1 to 65536; got '0.001'"):
        _child.resolve_bounds(None, "0.001")


def test_flags_win_over_the_variables_which_win_over_the_defaults(monkeypatch) -> None:
    assert _child.resolve_bounds(None, None).timeout_label == "the default --timeout 1800 s"
    assert _child.resolve_bounds(None, None).max_memory_gb is None
    monkeypatch.setenv(_child.TIMEOUT_VARIABLE, "20")
    monkeypatch.setenv(_child.MEMORY_VARIABLE, "8")
    bounds = _child.resolve_bounds(None, None)
    assert (bounds.timeout_s, bounds.max_memory_gb) == (20.0, 8.0)
    assert bounds.timeout_label == "TRAINMEM_TRACE_TIMEOUT 20 s"
    bounds = _child.resolve_bounds("5", "2.5")
    assert (bounds.timeout_label, bounds.memory_label) == (
        "--timeout 5 s",
        "--max-memory-gb 2.5 GB",
    )


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--timeout", "0"], "error: --timeout: must be a number of seconds from 0.1 to 604800"),
        (["--timeout", "nan"], "error: --timeout: must be a number of seconds"),
        (["--max-memory-gb", "0.001"], "error: --max-memory-gb: must be a number of GB from 1"),
        (["--max-memory-gb", "abc"], "error: --max-memory-gb: must be a number of GB"),
    ],
)
def test_trace_refuses_bad_bounds_before_anything_runs(argv, words, capsys, monkeypatch) -> None:
    monkeypatch.setattr(_child, "run_in_child", _no_child)
    assert main(["trace", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(words) and err.count("\n") == 1


@pytest.mark.parametrize("raw", ["0", "-5", "nan", "abc", "1e309", "0.001"])
def test_trace_refuses_bad_bound_variables_in_one_line(raw, capsys, monkeypatch) -> None:
    monkeypatch.setattr(_child, "run_in_child", _no_child)
    for variable in (_child.TIMEOUT_VARIABLE, _child.MEMORY_VARIABLE):
        with monkeypatch.context() as patch:
            patch.setenv(variable, raw)  # 0.001 s is below 0.1 s too
            assert main(["trace"]) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"error: trace: {variable} must be a number of")
            assert err.count("\n") == 1


def _no_child(*args: object, **kwargs: object) -> None:
    raise AssertionError("a trace child was started for bad input")


def test_save_profile_to_a_path_that_cannot_be_written_is_refused_first(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """Before any trace (no child is started): a folder, a missing folder, a name too long, a
    folder nothing can be created in (/proc refuses root too)."""
    monkeypatch.setattr(_child, "run_in_child", _no_child)
    cases = {
        str(tmp_path): "is a folder, not a file",
        str(tmp_path / "missing" / "p.json"): "does not exist",
        str(tmp_path / ("x" * 300 + ".json")): "file name too long",
        "/proc/trainmem-profile.json": "cannot write in /proc",
    }
    for path, words in cases.items():
        assert main(["trace", "--model", "gpt2", "--save-profile", path]) == 2, path
        err = capsys.readouterr().err
        assert err.startswith("error: save-profile: ") and words in err, err
        assert err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # nothing written, no probe left


# ---- end to end: the real trace child on hostile factories --------------------------------------

needs_torch = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("torch", "transformers")),
    reason="trainmem[trace] not installed: pip install 'trainmem[trace]'",
)


def _trace(factory: str, *flags: str, capsys) -> tuple[int, str]:
    code = main(["trace", "--module", f"{HOSTILE}:{factory}", "--seq-len", "8", *flags])
    out, err = capsys.readouterr()
    return code, err


@needs_torch
@needs_proc
def test_a_model_that_leaves_detached_grandchildren_has_them_killed(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.setenv(PID_FILE_VARIABLE, str(tmp_path / "pids"))
    code = main(["trace", "--module", f"{HOSTILE}:detached_grandchildren", "--timeout", "120"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "one step traced on" in out  # the report, not the lines the model printed
    pids = _pids(tmp_path / "pids")
    assert len(pids) == 2 and not [pid for pid in pids if _alive(pid)]
    assert not _my_zombies()


@needs_torch
@needs_proc
def test_a_looping_forward_is_stopped_at_the_timeout(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv(PID_FILE_VARIABLE, str(tmp_path / "pids"))
    start = time.monotonic()
    code, err = _trace("detached_grandchildren_then_loop", "--timeout", "10", capsys=capsys)
    assert time.monotonic() - start < 40
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("error: trace exceeded --timeout 10 s and was stopped")
    # on a machine so loaded that torch did not import within 10 s the factory never ran
    assert not [pid for pid in _pids(tmp_path / "pids") if _alive(pid)]
    assert not _my_zombies()


@needs_torch
@pytest.mark.parametrize(
    ("factory", "words"),
    [
        ("exits", "error: trace: the child process exited with status 7 before answering"),
        ("segfaults", "error: trace: the child process was killed by SIGSEGV"),
    ],
)
def test_a_model_that_kills_its_process_is_one_line(factory, words, capsys) -> None:
    code, err = _trace(factory, "--timeout", "120", capsys=capsys)
    assert code == 2 and err.startswith(words) and err.count("\n") == 1, err


@needs_torch
def test_a_model_that_allocates_without_bound_is_stopped_at_the_memory_cap(capsys) -> None:
    code, err = _trace("memory_hog", "--timeout", "120", "--max-memory-gb", "2", capsys=capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: trace exceeded --max-memory-gb 2 GB: ")


@needs_proc
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_terminated_parent_kills_the_trace_on_its_way_out(tmp_path: Path, signum: int) -> None:
    """A scheduler's SIGTERM (or a closed terminal's SIGHUP) to trainmem while the trace runs:
    the trace's processes die with it, and trainmem ends by that signal."""
    pid_file = tmp_path / "pids"
    parent_code = (
        "import sys; from trainmem.trace import _child; "
        "_child.run_in_child('trace_step', {}, bounds=_child.resolve_bounds('300', None), "
        "command=[sys.executable, '-c', sys.argv[1], sys.argv[2], 'hang'])"
    )
    env = {k: v for k, v in os.environ.items() if k != _child.CHILD_MARKER}
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code, LEAVES_SLEEPERS, str(pid_file)],
        env=env,
        start_new_session=True,
    )
    try:
        assert _wait_for(lambda: len(_pids(pid_file)) == 3, 30)
        os.kill(parent.pid, signum)
        assert parent.wait(timeout=30) == -signum
        assert not [pid for pid in _pids(pid_file) if _alive(pid)]
    finally:
        _kill_all(parent, pid_file)


def _kill_all(parent: subprocess.Popen[bytes], pid_file: Path) -> None:
    """Whatever a failed test left behind."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(parent.pid, signal.SIGKILL)
    parent.wait(timeout=30)
    for pid in _pids(pid_file):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@needs_torch
@needs_proc
def test_a_sigkilled_trainmem_leaves_no_process_of_the_trace(tmp_path: Path) -> None:
    """A SIGKILL, which trainmem cannot see: the real child sees its parent gone and kills the
    trace's processes and itself (it is a subreaper too, so the double-forked daemon is still
    its descendant)."""
    signum = signal.SIGKILL
    pid_file = tmp_path / "pids"
    env = {k: v for k, v in os.environ.items() if k != _child.CHILD_MARKER}
    env[PID_FILE_VARIABLE] = str(pid_file)
    argv = ["trace", "--module", f"{HOSTILE}:detached_grandchildren_then_loop", "--timeout", "300"]
    code = f"import sys; from trainmem.cli import main; sys.exit(main({argv!r}))"
    trainmem = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert _wait_for(lambda: len(_pids(pid_file)) == 2, 120), "the factory never ran"
        table = _procs.process_table()
        children = [p.pid for p in table.values() if p.ppid == trainmem.pid]
        os.kill(trainmem.pid, signum)
        assert trainmem.wait(timeout=30) == -signum
        left = [*children, *_pids(pid_file)]
        assert _wait_for(lambda: not [pid for pid in left if _alive(pid)], 10), left
    finally:
        _kill_all(trainmem, pid_file)
