"""Fuzz every option of every command, and every field of every HTTP request, drawn from their
declarations (issue 31 item 6).

The commands and their click parameters, and the HTTP routes and their request models, are read
from the apps when the tests are collected: a new flag or field is fuzzed the day it is declared.
Each option gets hostile values of its declared type (integers: 0, -1, 2^63, bound neighbours;
floats: nan, inf, -0.0, 1e309; choices: wrong case, empty, unicode, neighbours; strings: paths
that are missing, a folder, /dev/zero, a name too long, and newlines, control characters, 10,000
characters), beside valid draws of the command's other options, and the command runs in-process
(cli.main, the console script). What must hold (docs/exit-codes.md):

- no traceback and no uncaught exception; an exit code of the contract (1 only with --check, or
  from `check`, whose verdict it is);
- exit 2: exactly one stderr line, `error: ...`, naming a given option (or `layout`, a rule
  between fields), and nothing written;
- exit 0 or 1 with --json: strict JSON (no NaN, no Infinity) whose every number is finite and
  >= 0 (differences excepted: SIGNED keys and the `difference` of `compare`).

HTTP (fastapi's TestClient): every body field of every POST route and its query parameters
likewise: 4xx with one `error` line naming the field, or 200 with finite, non-negative figures;
never a 5xx. A JSON value of another type (true or "2048" for an integer) is refused, not cast.

Bounded for CI: sweep, recommend and heatmap run on a small space (BASE_ARGV, which drawn flags
override; valid integers are drawn near their lower bound); `serve` runs up to uvicorn (stubbed)
and `trace` up to the trace itself (stubbed): their validation only. Every run is under a time
alarm and an address-space cap, so that a regression fails here instead of hanging CI.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import resource
import shutil
import signal
import socket
import tempfile
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainmem.cli import main
from trainmem.cli._app import app
from trainmem.cli._options import NAME_COMPLETERS
from trainmem.engine import Overheads, TimeParams

REPO = Path(__file__).parents[2]

# ---- what is fuzzed: read from the app ----------------------------------------------------------

SKIPPED = ("help", "show_version")
"""click's --help and the group's --version: they print and exit 0 whatever else is given."""


def _commands() -> dict[str, Any]:
    group = typer.main.get_command(app)
    return {name: group.commands[name] for name in group.list_commands(None)}


COMMANDS = _commands()


def _declared(command: Any) -> dict[str, Any]:
    """The report.Option declarations behind a command built by cli._options.command (choices,
    bounds), by name; empty for a command written with typer directly."""
    function = command.callback
    while function is not None and not hasattr(function, "options"):
        function = getattr(function, "__wrapped__", None)
    return {o.name: o for o in getattr(function, "options", ())}


def _params(command: Any) -> list[Any]:
    ctx = command.context_class(command)
    return [p for p in command.get_params(ctx) if p.name not in SKIPPED]


CASES = [(name, p.name) for name, command in COMMANDS.items() for p in _params(command)]
"""(command, parameter): every option and argument of every command."""


def _annotation(param: Any) -> Any:
    """The parameter's Python type without None (`str | None` -> str)."""
    kind = param.type_descriptor.annotation
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return args[0] if len(args) == 1 else kind
    return kind


def _choices(param: Any, declared: Any) -> tuple[str, ...] | None:
    """The fixed choices: the declaration's, else the `[a|b|c]` type --help shows."""
    if declared is not None and declared.choices:
        return tuple(declared.choices)
    metavar = getattr(param, "metavar", None) or ""
    text = metavar.replace("\n", "").strip("[]")
    if "|" in text and re.fullmatch(r"[\w.+|-]+", text):
        return tuple(text.split("|"))
    return None


# ---- hostile and valid values by declared type --------------------------------------------------

INT_HOSTILE = (
    "0", "-1", "1", str(2**31), str(2**63 - 1), str(2**63), str(-(2**63) - 1), "1" + "0" * 30,
    "9" * 5000, "1.5", "2.0", "abc", "", " ", "1e3", "0x10", "\u0661\u0662", "1_000", "nan",
)  # fmt: skip
FLOAT_HOSTILE = (
    "nan", "-nan", "inf", "-inf", "-0.0", "0", "-1", "1", "1e309", "-1e309", "1e-320", "1e300",
    "5e-324", "abc", "", "0x1p3", "1,5", "\u0661.\u0665", "1e", "infinity",
)  # fmt: skip
TEXT_HOSTILE = (
    "", " ", "\n", "a\nb", "\t\x01\x1b[31m\x7f", "x" * 10_000, "\u00fc\u2713\u6f22\u5b57", "-",
    "-x", "../../etc/passwd", "~", "$HOME", "'", '"', "1", "nan", "a,b", ",",
)  # fmt: skip
PATH_HOSTILE = (
    "{TMP}/missing/file.json", "{TMP}/missing.toml", "{TMP}/folder", "{TMP}/zero", "{TMP}/null",
    "{TMP}/garbage.bin", "{TMP}/empty.txt", "{TMP}/unreadable.json", "{TMP}/" + "n" * 300,
    "{TMP}/" + "/".join(["d" * 200] * 25) + "/x.json",
)  # fmt: skip
"""Files made in each example's own folder (`_hostile_folder`): /dev/zero and /dev/null are
reached through symlinks there, so that an atomic write replaces the link, never the device;
unreadable.json has mode 000 (readable all the same when the tests run as root)."""

KEYED = {"overhead": Overheads.names(), "time_param": TimeParams.names()}
"""KEY=VALUE options and their keys (a new one without an entry is fuzzed as text)."""
SMALL = {"jobs": 1, "workers": 2}
"""The largest valid draw of options that start processes (each one costs seconds)."""
VALID = {
    "fleet": ("2xa100-sxm-40gb", "{W}/fleet.toml"),
    "path": ("{W}/points",),
    "points": ("{W}/points",),
    "files": ("{W}/job.yaml",),
    "x_values": ("1,2",),
    "y_values": ("512,1024",),
    "vs": ("--zero 2", "--tp 2 --recompute none"),
    "host": ("127.0.0.1",),
    "port": ("{PORT}",),
    "objective": ("cost", "time", "cost,time"),
}
"""Valid values of open vocabularies beside the default and the catalogue's names."""

BASE_ARGV = {
    "sweep": [
        *("--out", "{TMP}/sweep", "--fleet", "8xa100-sxm-40gb", "--model", "llama-3.2-1b"),
        *("--max-pp", "2", "--max-cp", "1", "--max-micro-batch-size", "2", "--trials", "8"),
    ],
    "recommend": [
        *("--fleet", "8xa100-sxm-40gb", "--model", "llama-3.2-1b"),
        *("--max-pp", "2", "--max-cp", "1", "--max-micro-batch-size", "2"),
    ],
    "heatmap": ["--out", "{TMP}/heatmap.svg", "--x-values", "1,2", "--y-values", "512,1024"],
    "fit": ["--max-micro-batch-size", "64", "--max-num-gpus", "64"],
    "serve": ["--port", "{PORT}"],
    "trace": ["--model", "gpt2", "--seq-len", "64"],
    "compare": ["--vs", "--zero 2"],
}
"""Flags every run of a command starts with (a small search space, outputs in the example's
folder); the drawn flags come after them and win."""
SNAPSHOT = str(Path(__file__).parents[1] / "data" / "snapshots" / "linear_adamw.pickle")
"""A small snapshot in torch's format (tests/data/snapshots/make_torch_format.py) for explain."""
BASE_ARGUMENTS = {
    "points": ["{W}/points"],
    "check": ["{W}/job.yaml"],
    "completion": ["bash"],
    "explain": [SNAPSHOT],
}
"""The command's positional arguments when the draw leaves them out."""


def _bounds(declared: Any) -> tuple[Any, Any, Any, Any]:
    return tuple(getattr(declared, k, None) for k in ("ge", "le", "gt", "lt"))  # type: ignore[return-value]


def _int_values(declared: Any, name: str) -> tuple[tuple[str, ...], st.SearchStrategy[str]]:
    """(hostile texts, valid draws) of an integer option: INT_HOSTILE and its bounds' edges;
    valid values within 3 of the lower bound (a small search, SMALL for processes)."""
    ge, le, gt, lt = _bounds(declared)
    edges = [str(int(b) + d) for b, d in ((ge, -1), (le, 1), (gt, 0), (lt, 0)) if b is not None]
    low = int(ge) if ge is not None else int(gt) + 1 if gt is not None else 1
    high = int(le) if le is not None else int(lt) - 1 if lt is not None else low + 3
    high = min(high, low + 3, SMALL.get(name, high))
    return (*INT_HOSTILE, *edges), st.integers(low, max(low, high)).map(str)


def _float_values(declared: Any) -> tuple[tuple[str, ...], st.SearchStrategy[str]]:
    """(hostile texts, valid draws) of a float option: FLOAT_HOSTILE, each bound and the float
    just outside it; valid values anywhere inside."""
    ge, le, gt, lt = _bounds(declared)
    edges = [repr(float(b)) for b in (ge, le, gt, lt) if b is not None]
    edges += [repr(math.nextafter(float(b), -math.inf)) for b in (ge, gt) if b is not None]
    edges += [repr(math.nextafter(float(b), math.inf)) for b in (le, lt) if b is not None]
    low, high = 0.0, 1e3
    if ge is not None or gt is not None:
        low = float(ge) if ge is not None else math.nextafter(float(gt), math.inf)
    if le is not None or lt is not None:
        high = float(le) if le is not None else math.nextafter(float(lt), -math.inf)
    valid = st.floats(low, max(low, high), allow_nan=False, allow_infinity=False).map(repr)
    return (*FLOAT_HOSTILE, *edges), valid


def _choice_values(choices: tuple[str, ...]) -> tuple[str, ...]:
    c = choices[0]
    return (
        *(x.upper() for x in choices[:3]), c.title(), "", " ", f"{c} ", f" {c}", f"{c}x",
        c[:-1], c.replace("-", "_"), f"\u00fc{c}", f"{c}\n", ",".join(choices[:2]),
    )  # fmt: skip


def _valid_text(param: Any) -> list[str]:
    names: list[str] = [str(param.default)] if isinstance(param.default, str) else []
    names += list(VALID.get(param.name, ()))
    complete = NAME_COMPLETERS.get(param.name)
    if complete is not None:
        found = complete(type("Ctx", (), {"params": {}})(), "")
        small = [n for n in found if re.search(r"gpt2|1b|2b|7b|8b|h100|a100|adam|sgd", n)]
        names += small[:6]
    return names or ["x"]


def value_strategy(param: Any, declared: Any, *, hostile: bool) -> st.SearchStrategy[list[str]]:
    """argv tokens for one parameter: its flag and a value of its declared type, hostile or
    valid (a flag: itself or its --no- form)."""
    flags = list(getattr(param, "opts", ())) + list(getattr(param, "secondary_opts", ()))
    argument = param.param_type_name == "argument"

    def tokens(value: str) -> list[str]:
        return [value] if argument else [flags[0], value]

    if getattr(param, "is_flag", False):
        return st.sampled_from(flags).map(lambda f: [f])
    kind = _annotation(param)
    choices = _choices(param, declared)
    if choices:
        bad = st.sampled_from(_choice_values(choices))
        good = st.sampled_from(choices)
    elif kind is int:
        hostile_ints, good = _int_values(declared, param.name)
        bad = st.sampled_from(hostile_ints)
    elif kind is float:
        hostile_floats, good = _float_values(declared)
        bad = st.sampled_from(hostile_floats)
    elif param.name in KEYED:
        keys = st.sampled_from(KEYED[param.name])
        bad = st.one_of(
            st.tuples(keys, st.sampled_from(FLOAT_HOSTILE)).map("=".join),
            st.sampled_from(("=", "a=b=c", "bogus=1", KEYED[param.name][0], "")),
        )
        good = keys.map(lambda k: f"{k}=0.5")
    else:
        bad = st.sampled_from((*PATH_HOSTILE, *TEXT_HOSTILE))
        good = st.sampled_from(_valid_text(param))
    return (bad if hostile else good).map(tokens)


# ---- running one command ------------------------------------------------------------------------


class _TooSlow(BaseException):
    """Raised by the alarm: a run past its time (BaseException: no `except Exception` eats it)."""


class _Traced(BaseException):
    """`trace` got past its checks to the trace itself (stubbed here)."""


RUN_SECONDS = 30
"""One run's time; past it the example fails (unbounded work is a finding)."""
MEMORY_MARGIN_BYTES = 6 << 30
"""Address space a run may add: reading /dev/zero whole fails here with MemoryError (a finding)
instead of swamping the machine."""


def _address_space_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


@contextlib.contextmanager
def _bounded(seconds: float = RUN_SECONDS) -> Iterator[None]:
    def expire(*_: object) -> None:
        raise _TooSlow(f"past {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _address_space_bytes() + MEMORY_MARGIN_BYTES
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _hostile_folder() -> Path:
    """The example's folder: the hostile files PATH_HOSTILE names."""
    root = Path(tempfile.mkdtemp(prefix="fuzz-"))
    (root / "folder").mkdir()
    (root / "zero").symlink_to("/dev/zero")
    (root / "null").symlink_to("/dev/null")
    (root / "garbage.bin").write_bytes(b"\xff\xfe\x00garbage\x89PNG" * 64)
    (root / "empty.txt").write_text("")
    (root / "unreadable.json").write_text("{}")
    (root / "unreadable.json").chmod(0)
    return root


def _snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def run_cli(argv: list[str], cwd: Path) -> tuple[int | None, str, str]:
    """main(argv) in `cwd`, bounded; (exit code or None when trace reached its stub, stdout,
    stderr)."""
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            _bounded(),
            _stdin(),
        ):
            try:
                code: int | None = main(argv)
            except _Traced:
                code = None
    finally:
        os.chdir(here)
    return code, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def _stdin() -> Iterator[None]:
    import sys

    saved = sys.stdin
    sys.stdin = io.StringIO("")
    try:
        yield
    finally:
        sys.stdin = saved


SIGNED = ("headroom_bytes", "saved_bytes", "saved_s", "mean_log")
"""Differences (negative: over the limit; a change that costs memory or time) and the error
bars' mean log residual (negative: the stack's measured peaks below the predictions): finite
only."""
SIGNED_TREES = ("difference", "relative_error")
"""`compare`'s second configuration minus the first: finite only."""


def _strict_json(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} in the JSON output (invalid JSON)")

    return json.loads(text, parse_constant=refuse)


def bad_numbers(value: Any, key: str = "", signed: bool = False) -> list[tuple[str, Any]]:
    """(key, number) of every number that is not finite, or negative where it cannot be."""
    if isinstance(value, dict):
        return [
            bad
            for k, item in value.items()
            for bad in bad_numbers(item, str(k), signed or k in SIGNED_TREES)
        ]
    if isinstance(value, list):
        return [bad for item in value for bad in bad_numbers(item, key, signed)]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return []
    if not math.isfinite(value) or (value < 0 and not signed and key not in SIGNED):
        return [(key, value)]
    return []


def _names(params: list[Any]) -> set[str]:
    names = set()
    for p in params:
        names.add(p.name)
        names.update(
            o.lstrip("-") for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))
        )
    return {re.sub(r"[-_ ]+", " ", n.lower()).strip() for n in names if n}


CROSS_FIELD = ("layout",)
"""What an error may name instead of a given option: a rule between fields (docs/exit-codes.md)."""
MAX_LINE_CHARS = 1_500
"""The longest error line (cli MAX_ERROR_LINE_CHARS): an echoed value is shortened."""


def check_run(
    command: str,
    argv: list[str],
    given_params: list[Any],
    code: int | None,
    out: str,
    err: str,
    *,
    wrote: bool,
) -> None:
    """The contract of one run (module docstring)."""
    shown = " ".join(a[:80] for a in argv)
    context = f"trainmem {shown!r}\nstdout: {out[-300:]!r}\nstderr: {err[-600:]!r}"
    assert "Traceback" not in err, context
    if code is None:  # trace past its checks: validation passed
        return
    allowed = {0, 2} | ({1} if "--check" in argv or command == "check" else set())
    assert code in allowed, context
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), context
        line = re.sub(r"[-_ ]+", " ", lines[0].lower())
        names = _names(given_params) | set(CROSS_FIELD)
        files: list[str] = []
        if any(p.param_type_name == "argument" for p in given_params):
            names.add(command)  # `points: no part-*.parquet files under ...`
            # `FILE: no such file`, the name as given or quoted (a newline in it)
            files = [s[:40].lower() for a in argv[1:] if a.strip() for s in (a, repr(a)[1:-1])]
        named_file = any(f in lines[0].lower() for f in files)
        # A default the given values conflict with may be the one named (gpt2's positions and
        # the default seq_len): `error: FIELD: ...` with any option of the command.
        lead = line.removeprefix("error: ").split(":")[0].split(" (")[0].strip()
        named_default = lead in _names(_params(COMMANDS[command]))
        assert named_file or named_default or any(n and n in line for n in names), (
            f"the error names none of {sorted(names)}\n{context}"
        )
        assert len(lines[0]) <= MAX_LINE_CHARS, f"a line of {len(lines[0])} characters\n{context}"
        assert not wrote, f"bad input wrote files\n{context}"
        return
    if "--json" in argv and out.strip():
        try:
            report = _strict_json(out)
        except json.JSONDecodeError:
            if "--format" in argv:  # a launch file (slurm, torchrun): not JSON
                return
            raise AssertionError(f"--json printed no JSON\n{context}") from None
        bad = bad_numbers(report)
        assert not bad, f"not finite or negative: {bad[:5]}\n{context}"


# ---- the fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Valid inputs shared by every example (read, never written): a small sweep's points, a
    fleet file, a `check` job file, a free port; and the stubs of serve's and trace's work."""
    root = tmp_path_factory.mktemp("fuzz-world")
    argv = ["sweep", "--model", "llama-3.2-1b", "--fleet", "8xa100-sxm-40gb", "--max-pp", "2"]
    assert main([*argv, "--max-cp", "1", "--out", str(root / "points"), "--json"]) == 0
    (root / "fleet.toml").write_text('[[pool]]\ngpu = "a100-sxm-40gb"\nnodes = 1\n')
    shutil.copy(REPO / "tests/data/stacks/torchtune/gemma2_2B_full.yaml", root / "job.yaml")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {"W": str(root), "PORT": str(port)}


@pytest.fixture(autouse=True)
def _stubs(monkeypatch: pytest.MonkeyPatch) -> None:
    """serve stops before uvicorn runs; trace before it traces (its checks and its estimate
    run)."""
    try:
        import uvicorn
    except ImportError:  # the serve extra is not installed: serve is one error line
        pass
    else:
        monkeypatch.setattr(uvicorn, "run", lambda *a, **k: None)
    try:
        from trainmem.trace import _report
    except ImportError:  # the trace extra is not installed: its command is one error line
        return

    def traced(*_: object, **__: object) -> None:
        raise _Traced

    monkeypatch.setattr(_report, "_trace", traced)
    # The CLI's trace runs in a bounded child (trace/_child.py): stub the child's start too,
    # so that the checks made before it are what runs here.
    from trainmem.trace import _child

    monkeypatch.setattr(_child, "run_in_child", traced)


def _fill(tokens: list[str], folder: Path, world: dict[str, str]) -> list[str]:
    return [
        t.replace("{TMP}", str(folder)).replace("{W}", world["W"]).replace("{PORT}", world["PORT"])
        for t in tokens
    ]


def _argv(command: str, drawn: list[tuple[Any, list[str]]]) -> list[str]:
    """command, its arguments (drawn or BASE_ARGUMENTS), BASE_ARGV, then the drawn options."""
    arguments = [t for p, tokens in drawn if p.param_type_name == "argument" for t in tokens]
    options = [t for p, tokens in drawn if p.param_type_name != "argument" for t in tokens]
    if not arguments:
        arguments = list(BASE_ARGUMENTS.get(command, []))
    return [command, *arguments, *BASE_ARGV.get(command, []), *options]


def _base_params(command: str) -> list[Any]:
    """The parameters BASE_ARGV and BASE_ARGUMENTS give: an error may name them too."""
    given = set(BASE_ARGV.get(command, [])) | set(BASE_ARGUMENTS.get(command, []))
    params = _params(COMMANDS[command])
    return [
        p
        for p in params
        if set(getattr(p, "opts", ())) & given
        or (p.param_type_name == "argument" and command in BASE_ARGUMENTS)
    ]


def fuzz_once(command: str, drawn: list[tuple[Any, list[str]]], world: dict[str, str]) -> None:
    folder = _hostile_folder()
    try:
        argv = _fill(_argv(command, drawn), folder, world)
        if any(p.name == "as_json" for p in _params(COMMANDS[command])) and "--json" not in argv:
            argv.append("--json")
        before = _snapshot(folder)
        code, out, err = run_cli(argv, folder)
        wrote = _snapshot(folder) != before
        given_params = [p for p, _ in drawn] + _base_params(command)
        check_run(command, argv, given_params, code, out, err, wrote=wrote)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _others(command: str, skip: str) -> list[Any]:
    return [p for p in _params(COMMANDS[command]) if p.name != skip]


@st.composite
def _valid_others(draw: Any, command: str, skip: str, max_size: int) -> list[tuple[Any, list[str]]]:
    declared, others = _declared(COMMANDS[command]), _others(command, skip)
    if not others:
        return []
    chosen = draw(st.lists(st.sampled_from(others), max_size=max_size, unique_by=lambda p: p.name))
    return [(p, draw(value_strategy(p, declared.get(p.name), hostile=False))) for p in chosen]


PER_OPTION_EXAMPLES = max(2, settings.default.max_examples // 10)
"""Examples per (command, option) and per (route, field): ci 3, deep 100."""


def _digest(function: Any, case: str) -> Any:
    """`function` seeded by its case: derandomized, every parametrized case would otherwise draw
    the same positions of its value lists (hypothesis seeds by the function's source)."""
    function.hypothesis.inner_test._hypothesis_internal_add_digest = case.encode()
    return function


@pytest.mark.parametrize(("command", "name"), CASES, ids=[f"{c}-{n}" for c, n in CASES])
def test_every_option_refuses_hostile_values_in_one_line(
    command: str, name: str, world: dict[str, str]
) -> None:
    """One option of one command at a hostile value of its type, beside valid draws of up to
    two other options: one line naming it (exit 2), or an answer that holds."""
    params = {p.name: p for p in _params(COMMANDS[command])}
    param, declared = params[name], _declared(COMMANDS[command]).get(name)

    @given(
        value=value_strategy(param, declared, hostile=True),
        others=_valid_others(command, name, 2),
    )
    @settings(
        max_examples=PER_OPTION_EXAMPLES, suppress_health_check=list(HealthCheck), deadline=None
    )
    def fuzz(value: list[str], others: list[tuple[Any, list[str]]]) -> None:
        fuzz_once(command, [(param, value), *others], world)

    _digest(fuzz, f"{command}-{name}")()


@st.composite
def _mixed(draw: Any, command: str) -> list[tuple[Any, list[str]]]:
    declared = _declared(COMMANDS[command])
    chosen = draw(
        st.lists(
            st.sampled_from(_params(COMMANDS[command])),
            min_size=1,
            max_size=4,
            unique_by=lambda p: p.name,
        )
    )
    return [
        (p, draw(value_strategy(p, declared.get(p.name), hostile=draw(st.booleans()))))
        for p in chosen
    ]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_holds_under_mixed_draws(command: str, world: dict[str, str]) -> None:
    """Up to four options of one command, each hostile or valid: the same contract."""

    @given(drawn=_mixed(command))
    @settings(
        max_examples=max(4, settings.default.max_examples // 2),
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    def fuzz(drawn: list[tuple[Any, list[str]]]) -> None:
        fuzz_once(command, drawn, world)

    _digest(fuzz, command)()


def test_the_suite_walks_every_command_and_option() -> None:
    """The enumeration is the app's: every command and, of each, every option."""
    from trainmem.cli._app import LAZY_COMMANDS

    assert set(COMMANDS) == {"estimate", *LAZY_COMMANDS}
    assert len(CASES) >= 350
    assert {"estimate-seq_len", "sweep-trials", "serve-port", "trace-device"} <= {
        f"{c}-{n}" for c, n in CASES
    }


# ---- HTTP: every field of every request model ---------------------------------------------------


def _http_routes() -> dict[str, dict[str, Any]]:
    """path -> {field: its JSON schema} of every POST route's body model, and of its query
    parameters (`?format=`), read from the app (serve/_app.py request models)."""
    try:
        from fastapi.routing import APIRoute

        from trainmem.serve._app import create_app
    except ImportError:  # the serve extra is not installed: nothing to fuzz
        return {}
    routes: dict[str, dict[str, Any]] = {}
    for route in create_app().routes:
        if not isinstance(route, APIRoute) or "POST" not in route.methods:
            continue
        fields: dict[str, Any] = {}
        for body in route.dependant.body_params:
            schema = body.field_info.annotation.model_json_schema()
            fields.update(
                {
                    k: {**v, "$defs": schema.get("$defs", {})}
                    for k, v in schema["properties"].items()
                }
            )
        for query in route.dependant.query_params:
            choices = typing.get_args(query.field_info.annotation)
            fields[f"?{query.name}"] = {"type": "string", "enum": list(choices)}
        routes[route.path] = fields
    return routes


HTTP_ROUTES = _http_routes()
HTTP_CASES = [(path, name) for path, fields in HTTP_ROUTES.items() for name in fields]


def _branches(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The schema's non-null alternatives (`anyOf` of an optional field, `fleet`'s union)."""
    options = schema.get("anyOf", [schema])
    return [o for o in options if o.get("type") != "null"]


def _json(value: Any) -> str:
    return json.dumps(value)


def json_values(schema: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """(hostile, wrongly typed, valid) raw JSON texts for one field; wrongly typed values (true
    or "2048" for an integer) must be refused, not cast."""
    hostile: list[str] = ["null", "[]", "{}", '""', "[" * 40 + "]" * 40]
    wrong: list[str] = []
    valid: list[str] = [_json(schema["default"])] if "default" in schema else []
    for branch in _branches(schema):
        kind = branch.get("type")
        if "$ref" in branch or (kind == "array" and "$ref" in branch.get("items", {})):
            pools = ('{"gpu": "h100-sxm-80gb", "num_nodes": 1e400}', '{"gpu": "x", "num_nodes": 1}')
            hostile += [
                *pools,
                f"[{pools[0]}]",
                "[" + ", ".join(['{"gpu": "h100-sxm-80gb"}'] * 65) + "]",
            ]
            hostile += ['[{"gpu": "h100-sxm-80gb", "num_nodes": 1000000, "gpus_per_node": 1024}]']
            valid.append('[{"gpu": "a100-sxm-40gb", "num_nodes": 1}]')
        elif "enum" in branch:
            choices = [str(c) for c in branch["enum"]]
            c = choices[0]
            hostile += [
                _json(x) for x in (c.upper(), f"{c} ", f"{c}x", c[:-1], f"\u00fc{c}", "x" * 5000)
            ]
            wrong += ["1", "true"]
            valid += [_json(x) for x in choices[:3]]
        elif kind == "integer":
            low, high = branch.get("minimum", 0), branch.get("maximum", 2**31)
            hostile += [str(v) for v in (low - 1, high + 1, 0, -1, 2**31, 2**63, -(2**63) - 1)]
            hostile += ["1e400", "-1e400", "9" * 5000]
            wrong += ["true", "false", '"2048"', "2048.5", '"1e3"']
            valid += [str(v) for v in range(int(low), int(min(high, low + 3)) + 1)]
        elif kind == "number":
            low = branch.get("minimum", branch.get("exclusiveMinimum", 0))
            high = branch.get("maximum", branch.get("exclusiveMaximum", 1e3))
            hostile += ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "-0.0", "5e-324"]
            hostile += [str(v) for v in (low, high, -1, 1e300)]
            wrong += ["true", '"0.5"']
            valid += [repr((low + high) / 2), repr(low + (high - low) / 4)]
        elif kind == "boolean":
            wrong += ['"true"', "1", "0", '"yes"']
            valid += ["true", "false"]
        elif kind == "string":
            limit = branch.get("maxLength", 4096)
            hostile += [_json(v) for v in ("x" * (limit + 1), "\n", "a\u0000b", "\t\x01\x1b[31m")]
            hostile += [_json(v) for v in ("/dev/zero", "../../etc/passwd", "8xh100-sxm-80gb.toml")]
            hostile += [_json(v) for v in ("99999999x" + "h" * 60, "2x", "0xh100-sxm-80gb", ",")]
            wrong += ["1", "true"]
        elif kind == "array":
            item = branch.get("items", {})
            hostile += ['[""]', '["=", "a=b=c"]', "[" + ", ".join(['"x"'] * 65) + "]"]
            hostile += ['["cuda_context_bytes=Infinity"]', '["fragmentation_fraction=1e400"]']
            hostile += ['["gemm_efficiency_max=nan"]', '["cuda_context_bytes=1e300"]']
            if item.get("type") == "string":
                wrong += ["[1]", '"cuda_context_bytes=1"']
            valid.append("[]")
        elif kind == "object":
            hostile += [
                '{"": ""}',
                '{"a.yaml": 1}',
                _json({"n" * 300: ""}),
                '{"job.yaml": "\\u0000"}',
            ]
            hostile += [_json({f"{i}.yaml": "x: 1" for i in range(17)}), '{"x.yaml": "[[[["}']
            valid.append(
                _json(
                    {
                        "job.yaml": (
                            REPO / "tests/data/stacks/torchtune/gemma2_2B_full.yaml"
                        ).read_text()
                    }
                )
            )
    return hostile, wrong, valid or ["null"]


@pytest.fixture(scope="module")
def http() -> Iterator[Any]:
    """fastapi's TestClient on the app, its worker processes started (and ended after)."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from trainmem.serve._app import Limits, create_app

    with TestClient(create_app(limits=Limits(timeout_s=60))) as client:
        yield client


HTTP_CROSS_FIELD = ("layout", "work limit", "body")
"""What a 422 may name instead of a given field: a rule between fields, the work it would
take, the body as a whole."""


HTTP_BASE = {
    "/v1/check": {
        "files": _json(
            {"job.yaml": (REPO / "tests/data/stacks/torchtune/gemma2_2B_full.yaml").read_text()}
        )
    }
}
"""Fields a route requires, sent unless drawn (check's `files`: a torchtune job)."""


def post(client: Any, path: str, fields: dict[str, str]) -> Any:
    """POST the raw JSON texts of `fields` (query parameters: `?name`) over HTTP_BASE."""
    fields = {**HTTP_BASE.get(path, {}), **fields}
    query = {k[1:]: json.loads(v) for k, v in fields.items() if k.startswith("?")}
    body = (
        "{"
        + ", ".join(f"{_json(k)}: {v}" for k, v in fields.items() if not k.startswith("?"))
        + "}"
    )
    return client.post(
        path, content=body, params=query, headers={"content-type": "application/json"}
    )


def check_answer(path: str, fields: dict[str, str], got: Any, *, refused: bool = False) -> None:
    """The HTTP contract of one answer (module docstring)."""
    fields = {**HTTP_BASE.get(path, {}), **fields}
    context = f"POST {path} {str(fields)[:400]}\n{got.status_code}: {got.text[:400]}"
    assert got.status_code < 500, context
    assert got.status_code in ((413, 415, 422) if refused else (200, 413, 415, 422)), context
    if got.status_code == 200:
        bad = bad_numbers(_strict_json(got.text))
        assert not bad, f"not finite or negative: {bad[:5]}\n{context}"
        return
    error = got.json().get("error", "")
    assert error and "\n" not in error and len(error) <= 300, context
    line = re.sub(r"[-_ ]+", " ", error.lower())
    names = {re.sub(r"[-_ ]+", " ", k.lstrip("?").lower()) for k in fields} | set(HTTP_CROSS_FIELD)
    lead = line.split(":")[0].split(".")[0].strip()  # any field of the route (a default's)
    known = {re.sub(r"[-_ ]+", " ", k.lstrip("?")) for k in HTTP_ROUTES[path]}
    files = [name for name in _object_keys(fields.get("files")) if name.strip()]
    names.update(re.sub(r"[-_ ]+", " ", name.lower())[:40] for name in files)  # `job.yaml: ...`
    assert got.status_code != 422 or lead in known or any(n in line for n in names), (
        f"the error names none of {sorted(names)}\n{context}"
    )


def _object_keys(text: str | None) -> list[str]:
    """The keys of a JSON object text (check's `files`: the names its errors give)."""
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return []
    return [str(k) for k in value] if isinstance(value, dict) else []


@pytest.mark.parametrize(("path", "name"), HTTP_CASES, ids=[f"{p}-{n}" for p, n in HTTP_CASES])
def test_every_http_field_refuses_hostile_values(http: Any, path: str, name: str) -> None:
    """One field of one route at a hostile value, beside valid draws of up to two others:
    422 naming it, or 200 with finite non-negative figures; never a 5xx."""
    fields = HTTP_ROUTES[path]
    hostile, _, _ = json_values(fields[name])
    others = [k for k in fields if k != name]

    @st.composite
    def draws(draw: Any) -> dict[str, str]:
        chosen = draw(st.lists(st.sampled_from(others), max_size=2, unique=True)) if others else []
        drawn = {k: draw(st.sampled_from(json_values(fields[k])[2])) for k in chosen}
        return {**drawn, name: draw(st.sampled_from(hostile))}

    @given(body=draws())
    @settings(
        max_examples=PER_OPTION_EXAMPLES, suppress_health_check=list(HealthCheck), deadline=None
    )
    def fuzz(body: dict[str, str]) -> None:
        check_answer(path, body, post(http, path, body))

    _digest(fuzz, f"{path}-{name}")()


def test_every_http_field_takes_only_its_json_type(http: Any) -> None:
    """true, 1 or "2048" where the schema says integer, boolean or string is refused naming the
    field (pydantic would cast them: {"seq_len": true} was seq_len 1)."""
    for path, fields in HTTP_ROUTES.items():
        for name, schema in fields.items():
            if name.startswith("?"):
                continue
            for value in json_values(schema)[1]:
                got = post(http, path, {name: value})
                check_answer(path, {name: value}, got, refused=True)


def test_the_http_suite_walks_every_route_and_field() -> None:
    pytest.importorskip("fastapi")
    assert set(HTTP_ROUTES) == {"/v1/estimate", "/v1/fit", "/v1/recommend", "/v1/check"}
    assert len(HTTP_CASES) >= 150
