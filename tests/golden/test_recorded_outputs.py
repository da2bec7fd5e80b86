"""Recorded CLI outputs: every recorded `trainmem` invocation gives the same bytes today.

The recordings (tests/data/recordings/*.json) were made from a pristine checkout by
tests/data/recordings/make_recordings.py, which imports this module by path and uses the same
capture, environment and normalisation as the replay below. Each case is one or more CLI steps
(argv) run in process in a fresh temporary folder; a step records its exit code and the sha256
of its stdout and stderr (after `normalise`), and some steps also their full text, which is
diffed when it differs. Sweep cases also record the Parquet points they wrote.

What is normalised (the only things that differ between two runs of the same code):
  * the temporary folder of the case (argv `{TMP}`, and the folder pytest/the generator made)
    -> `<TMP>`;
  * wall-clock timings of `sweep`: `"elapsed_s": 0.123` -> `"elapsed_s": "<ELAPSED>"`, and
    the human line's `in 0.05 s ->` -> `in <ELAPSED> s ->`;
  * the absolute path of a built-in GPU profile (`gpus --json` "path") -> `<GPUS>/NAME.toml`
    (it names the install location, not an output of the code);
  * in the Parquet points: the `trainmem_version` metadata key (the package version) is left
    out, and rows are hashed sorted by every column.

To record again (only from a pristine checkout of the commit whose behaviour is the reference):
    python tests/data/recordings/make_recordings.py --source PATH/TO/CHECKOUT
"""

from __future__ import annotations

import difflib
import hashlib
import io
import json
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

import pytest

RECORDINGS = Path(__file__).resolve().parent.parent / "data" / "recordings"
KINDS = ("estimate", "fit", "recommend", "heatmap", "sweep", "lists", "readme")
"""One recording file per kind: RECORDINGS/KIND.json."""
TMP = "{TMP}"
"""In a recorded argv: the case's temporary folder (absolute paths of written files)."""
TMP_TEXT = "<TMP>"
ENV_DROP_PREFIXES = ("TRAINMEM_",)
ENV_DROP = (
    "FORCE_COLOR",
    "NO_COLOR",
    "CLICOLOR",
    "CLICOLOR_FORCE",
    "TTY_COMPATIBLE",
    "TTY_INTERACTIVE",
    "JUPYTER_COLUMNS",
    "JUPYTER_LINES",
)
ENV_SET = {"COLUMNS": "80", "LINES": "25"}
"""The environment of every case: no user folders (TRAINMEM_*), no forced colours, a fixed
terminal size (rich and typer read them)."""
VARYING_METADATA = ("trainmem_version",)
MAX_DIFF_LINES = 200


# ---- shared with make_recordings.py -------------------------------------------------------------


def cli_main() -> Callable[[list[str]], int]:
    """The CLI's in-process entry point, wherever it lives now."""
    try:
        from trainmem.cli import main
    except ImportError:
        from trainmem.sweep.cli import main
    return main


def environment(environ: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """(names to remove, names to set) that give a case its fixed environment."""
    drop = sorted(k for k in environ if k.startswith(ENV_DROP_PREFIXES) or k in ENV_DROP)
    return drop, dict(ENV_SET)


def set_environment(environ: MutableMapping[str, str]) -> None:
    """Apply `environment` to os.environ directly (the generator; the test uses monkeypatch)."""
    drop, put = environment(environ)
    for k in drop:
        del environ[k]
    environ.update(put)


_ELAPSED_JSON = re.compile(r'("elapsed_s": )-?[0-9][0-9.eE+-]*')
_ELAPSED_TEXT = re.compile(r"( in )[0-9][0-9.,]* s( -> )")
_GPU_TOML = re.compile(r"(?<![^\s\"'(=])/(?:[^\s\"'<>]*/)?gpus/([A-Za-z0-9._+-]+\.toml)")


def tmp_spellings(tmp: Path) -> list[str]:
    """The ways the case folder can appear in output, longest first."""
    names = {str(tmp), os.path.realpath(tmp), str(tmp.resolve())}
    return sorted(names, key=len, reverse=True)


def normalise(text: str, tmp: Path) -> str:
    """`text` with what varies between runs of the same code replaced (see the module doc)."""
    for name in tmp_spellings(tmp):
        text = text.replace(name, TMP_TEXT)
    text = _ELAPSED_JSON.sub(r'\1"<ELAPSED>"', text)
    text = _ELAPSED_TEXT.sub(r"\1<ELAPSED> s\2", text)
    return _GPU_TOML.sub(r"<GPUS>/\1", text)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def step_argv(argv: Iterable[str], tmp: Path) -> list[str]:
    return [a.replace(TMP, str(tmp)) for a in argv]


def write_inputs(case: Mapping[str, Any], tmp: Path) -> None:
    """The input files a case reads by relative path (README commands), under `tmp`."""
    for rel, text in case.get("inputs", {}).items():
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def run_step(
    main: Callable[[list[str]], int],
    argv: list[str],
    tmp: Path,
    readouterr: Callable[[], tuple[str, str]],
) -> dict[str, Any]:
    """Run one recorded argv in process (cwd = `tmp`); its exit code, normalised stdout and
    stderr, and the warnings it raised. `readouterr` returns (and clears) what was captured."""
    readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            code: int | None = main(step_argv(argv, tmp))
            exception = None
        except (Exception, SystemExit) as exc:  # recorded, not raised
            code = None
            first = (str(exc).splitlines() or [""])[0]
            exception = f"{type(exc).__name__}: {normalise(first, tmp)}"
    out, err = readouterr()
    return {
        "exit_code": code,
        "exception": exception,
        "stdout": normalise(out, tmp),
        "stderr": normalise(err, tmp),
        "warnings": [f"{w.category.__name__}: {normalise(str(w.message), tmp)}" for w in caught],
    }


def points_digest(tmp: Path) -> dict[str, Any] | None:
    """The Parquet points written under `tmp`: part files, metadata, and a hash of the rows
    (every column, rows sorted by every column; floats by repr)."""
    import polars as pl

    files = sorted(tmp.rglob("part-*.parquet"))
    if not files:
        return None
    frames, metadata = [], []
    for f in files:
        meta = pl.read_parquet_metadata(f)
        metadata.append(
            {
                k: v
                for k, v in sorted(meta.items())
                if k.startswith("trainmem_") and k not in VARYING_METADATA
            }
        )
        frames.append(pl.read_parquet(f))
    frame = pl.concat(frames, how="vertical")
    frame = frame.sort(frame.columns, nulls_last=True, maintain_order=True)
    h = hashlib.sha256()
    for row in frame.iter_rows():
        h.update(repr(row).encode())
        h.update(b"\n")
    return {
        "parts": [f.relative_to(tmp).as_posix() for f in files],
        "metadata": metadata,
        "schema": [[c, str(t)] for c, t in frame.schema.items()],
        "num_rows": frame.height,
        "rows_sha256": h.hexdigest(),
    }


class SysCapture:
    """pytest's capsys for the generator: sys.stdout/sys.stderr swapped for the same kind of
    stream (a UTF-8 TextIOWrapper over BytesIO, newline='', write-through)."""

    def __enter__(self) -> SysCapture:
        self._saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = self._new(), self._new()
        return self

    def __exit__(self, *exc: object) -> None:
        sys.stdout, sys.stderr = self._saved

    @staticmethod
    def _new() -> io.TextIOWrapper:
        return io.TextIOWrapper(io.BytesIO(), encoding="UTF-8", newline="", write_through=True)

    def readouterr(self) -> tuple[str, str]:
        values = []
        for stream in (sys.stdout, sys.stderr):
            values.append(stream.buffer.getvalue().decode("UTF-8"))  # type: ignore[union-attr]
            stream.seek(0)
            stream.truncate()
        return values[0], values[1]


# ---- replay ------------------------------------------------------------------------------------


def _load(kind: str) -> dict[str, Any]:
    """One kind's recording (none yet: no cases, and test_recordings_cover_the_commands fails)."""
    path = RECORDINGS / f"{kind}.json"
    if not path.exists():
        return {"cases": []}
    return json.loads(path.read_text(encoding="utf-8"))


RECORDED = {kind: _load(kind) for kind in KINDS}
CASES = [case for kind in KINDS for case in RECORDED[kind]["cases"]]


def _diff(name: str, want: str, got: str) -> str:
    lines = list(
        difflib.unified_diff(
            want.splitlines(),
            got.splitlines(),
            f"recorded {name}",
            f"current {name}",
            lineterm="",
            n=2,
        )
    )
    more = len(lines) - MAX_DIFF_LINES
    return "\n".join(lines[:MAX_DIFF_LINES] + ([f"... {more} more diff lines"] if more > 0 else []))


def _compare(step: Mapping[str, Any], got: Mapping[str, Any]) -> list[str]:
    problems = []
    for key in ("exit_code", "exception", "warnings"):
        if step.get(key) != got[key]:
            problems.append(f"{key}: recorded {step.get(key)!r}, current {got[key]!r}")
    for stream in ("stdout", "stderr"):
        if step[f"{stream}_sha256"] == sha256(got[stream]):
            continue
        if stream in step and step[stream] == got[stream]:
            problems.append(f"{stream}: the recorded sha256 does not match the recorded text")
        elif stream in step:
            problems.append(f"{stream} differs:\n{_diff(stream, step[stream], got[stream])}")
        else:
            head = got[stream][:2000]
            problems.append(
                f"{stream} differs (sha256; not stored). Current {stream} begins:\n{head}"
            )
    return problems


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_recorded_output(
    case: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    drop, put = environment(os.environ)
    for k in drop:
        monkeypatch.delenv(k)
    for k, v in put.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    write_inputs(case, tmp_path)
    main = cli_main()

    def readouterr() -> tuple[str, str]:
        captured = capsys.readouterr()
        return captured.out, captured.err

    problems = []
    for i, step in enumerate(case["steps"]):
        got = run_step(main, step["argv"], tmp_path, readouterr)
        found = _compare(step, got)
        if found:
            command = " ".join(["trainmem", *step["argv"]])
            problems.append(f"step {i}: {command}\n" + "\n".join(found))
    if "points" in case:
        digest = points_digest(tmp_path)
        if digest != case["points"]:
            problems.append(f"points: recorded {case['points']!r}\ncurrent {digest!r}")
    assert not problems, f"case {case['id']}:\n" + "\n\n".join(problems)


def test_recordings_cover_the_commands() -> None:
    counts = {kind: len(RECORDED[kind]["cases"]) for kind in KINDS}
    estimate_json = [c for c in RECORDED["estimate"]["cases"] if "--json" in c["steps"][0]["argv"]]
    assert len(estimate_json) >= 500, counts
    assert counts["fit"] >= 50 and counts["recommend"] >= 15, counts
    assert counts["heatmap"] >= 8 and counts["sweep"] >= 8, counts
    assert len(RECORDED["readme"]["cases"][0]["steps"]) >= 20, counts
    assert len({c["id"] for c in CASES}) == len(CASES), "case ids must be unique"
