"""The user docs stay true: README.md and every docs/*.md page.

What runs: every `trainmem ...` line of a ```bash block and every `$ trainmem ...` line of a
```console block (continuation backslashes joined, a trailing `# comment` dropped), page by page
in the page's order, in process (`trainmem.cli.main`) with the repository root as the working
folder and no TRAINMEM_* variables set; each must exit 0. Blocks fenced as ```sh, ```text,
```python or with no language are shown, never run: use them for what cannot run here (`trainmem
serve`, which blocks; a database; the `trace` extra, torch; a real GPU; placeholders such as
DIR). `serve` lines are refused in run blocks.

What a console block's output must be: the lines under a `$ trainmem` line are its output. A line
`...` stands for any number of lines; every run of other lines must appear in what the command
prints, contiguous and in order (trailing spaces ignored). Without `...` the output must equal
what it prints.

Files: a command writes only under out/ (git-ignored) or a docs/ image (.png/.svg, the picture a
page shows, regenerated in place). The test gives out/ a fresh temporary folder per session (an
`out` or `out/...` argument, and a sweep's default --out, point there; printed paths are mapped
back), so points left in the repository's out/ by other runs or versions are never read. A command
reading stored points (`points DIR`, `heatmap --points DIR`) follows the page's sweep that writes
DIR; run on its own, it runs that sweep first.

Also checked: the README's accuracy table is the generated one, the README's example shows its
whole output, and every relative link of the docs points at a file that exists.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from trainmem.cli import main

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_BLOCKS = ("bash", "console")
FENCE = re.compile(r"^```([A-Za-z]*)\n(.*?)^```", re.S | re.M)


@dataclass
class Command:
    page: str
    """Path of the page relative to the repository root."""
    index: int
    """Position among the page's commands (0-based)."""
    line: str
    """The command as shown, `trainmem ...` on one line."""
    output: list[str] | None = None
    """A console block's shown output lines (None for a bash block)."""

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.line)[1:]

    @property
    def id(self) -> str:
        return f"{self.page}:{self.index + 1} {self.line}"


@dataclass
class Page:
    name: str
    text: str
    commands: list[Command] = field(default_factory=list)


def _join(text: str) -> list[str]:
    return text.replace("\\\n", " ").splitlines()


def _command(line: str) -> str:
    return re.sub(r"\s+#.*$", "", line.strip()).strip()


def parse(path: Path) -> Page:
    page = Page(path.relative_to(ROOT).as_posix(), path.read_text())
    for lang, body in FENCE.findall(page.text):
        if lang not in RUN_BLOCKS:
            continue
        if lang == "bash":
            for line in _join(body):
                if line.strip().startswith("trainmem "):
                    page.commands.append(Command(page.name, len(page.commands), _command(line)))
            continue
        current: Command | None = None
        lines = body.splitlines()
        while lines:
            line = lines.pop(0)
            if line.startswith("$ "):
                while line.endswith("\\") and lines:  # only a command continues on the next line
                    line = line[:-1] + " " + lines.pop(0).strip()
                current = None
                if line[2:].strip().startswith("trainmem "):
                    current = Command(page.name, len(page.commands), _command(line[2:]), [])
                    page.commands.append(current)
            elif current is not None and current.output is not None:
                current.output.append(line.rstrip())
    return page


PARSED = {p.relative_to(ROOT).as_posix(): parse(p) for p in PAGES}
COMMANDS = [c for page in PARSED.values() for c in page.commands]


def _option(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def writes(argv: list[str]) -> str | None:
    """The file or folder a command writes (relative to the root), if any."""
    if argv[0] == "sweep":
        return _option(argv, "--out") or "out"
    if argv[0] == "heatmap":
        return _option(argv, "--out") or "heatmap.png"
    if argv[0] == "trace":
        return _option(argv, "--save-profile")
    if argv[0] == "estimate":
        return _option(argv, "--plot") or _option(argv, "--memory-viz")
    return None


def reads_points(argv: list[str]) -> str | None:
    """The stored-points folder a command reads, if any."""
    if argv[0] == "points":
        positional = [a for a in argv[1:] if not a.startswith("-")]
        return positional[0] if positional else None
    if argv[0] == "heatmap":
        return _option(argv, "--points")
    return None


def localise(argv: list[str], out: Path) -> list[str]:
    """`argv` with the page's out/ folder moved to `out` (see the module docstring)."""
    mapped = [str(out) + a[3:] if a == "out" or a.startswith("out/") else a for a in argv]
    if argv[0] == "sweep" and _option(argv, "--out") is None:
        mapped += ["--out", str(out)]
    return mapped


def _run(argv: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    if argv[0] == "heatmap" or (argv[0] == "estimate" and "--plot" in argv):
        pytest.importorskip("matplotlib")
    if argv[0] == "trace":
        pytest.importorskip("torch")
    code = main(localise(argv, out))
    printed, err = capsys.readouterr()
    assert code == 0, err or printed
    return printed.replace(str(out), "out")


def _shows(printed: str, shown: list[str]) -> bool:
    """Whether `printed` shows the `shown` lines (`...` = any lines; see the module docstring)."""
    while shown and not shown[-1].strip():
        shown = shown[:-1]
    lines = [line.rstrip() for line in printed.strip("\n").splitlines()]
    if not any(s.strip() == "..." for s in shown):
        return lines == shown
    runs: list[list[str]] = [[]]
    for s in shown:
        if s.strip() == "...":
            runs.append([])
        else:
            runs[-1].append(s)
    anchored_start, anchored_end = bool(runs[0]), bool(runs[-1])
    at = 0
    for n, run in enumerate(runs):
        if not run:
            continue
        starts = [i for i in range(at, len(lines) - len(run) + 1) if lines[i : i + len(run)] == run]
        if n == 0 and anchored_start:
            starts = [i for i in starts if i == 0]
        if n == len(runs) - 1 and anchored_end:
            starts = [i for i in starts if i + len(run) == len(lines)]
        if not starts:
            return False
        at = starts[0] + len(run)
    return True


@pytest.fixture(scope="session")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's stand-in for the repository's out/ folder."""
    return tmp_path_factory.mktemp("docs") / "out"


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    for name in list(os.environ):
        if name.startswith("TRAINMEM_"):
            monkeypatch.delenv(name)


def test_pages_show_commands() -> None:
    assert len(PARSED["README.md"].commands) >= 1
    assert len(COMMANDS) >= 40
    assert "docs/README.md" in PARSED


@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_docs_command_runs(command: Command, out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = command.argv
    assert argv[0] != "serve", "serve blocks forever: show it in a ```sh block"
    folder = reads_points(argv)
    if folder is not None and not Path(localise(["points", folder], out)[1]).exists():
        for earlier in PARSED[command.page].commands[: command.index]:
            if writes(earlier.argv) == folder:
                _run(earlier.argv, out, capsys)
    printed = _run(argv, out, capsys)
    if command.output is not None:
        shown = "\n".join(command.output)
        assert _shows(printed, command.output), f"shown:\n{shown}\n\nprinted:\n{printed}"


@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_docs_command_writes_only_where_allowed(command: Command) -> None:
    target = writes(command.argv)
    if target is None:
        return
    path = Path(target)
    assert not path.is_absolute() and ".." not in path.parts, target
    assert path.parts[0] == "out" or (
        path.parts[0] == "docs" and len(path.parts) == 2 and path.suffix in (".png", ".svg")
    ), f"{command.line}: writes {target}; write under out/ (or a docs/ image)"


def test_readme_accuracy_table_is_generated() -> None:
    from tests.accuracy_table import BEGIN, END, markdown

    table = PARSED["README.md"].text.split(BEGIN)[1].split(END)[0].strip()
    assert table == markdown().strip(), "run: python -m bench.accuracy --update-readme"


def test_framework_accuracy_tables_are_generated() -> None:
    from tests import framework_accuracy as fa

    readme = PARSED["README.md"].text.split(fa.README_BEGIN)[1].split(fa.README_END)[0]
    assert readme.strip() == fa.summary_markdown().strip(), (
        "run: python -m bench.accuracy --update-readme"
    )
    docs = (ROOT / "docs" / "accuracy.md").read_text()
    cases = docs.split(fa.DOCS_BEGIN)[1].split(fa.DOCS_END)[0]
    assert cases.strip() == fa.cases_markdown().strip(), (
        "run: python -m bench.accuracy --update-readme"
    )
    techniques = (ROOT / "docs" / "techniques.md").read_text()
    modes = techniques.split(fa.MODES_BEGIN)[1].split(fa.MODES_END)[0]
    assert modes.strip() == fa.modes_markdown().strip(), (
        "run: python -m bench.accuracy --update-readme"
    )


def test_readme_example_output_is_current(out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's example is a whole output (no `...`), so it is compared exactly."""
    examples = [c for c in PARSED["README.md"].commands if c.output]
    assert examples, "the README shows one `$ trainmem estimate ...` with its output"
    example = examples[0]
    assert example.argv[0] == "estimate"
    assert all(line.strip() != "..." for line in example.output or [])
    assert _shows(_run(example.argv, out, capsys), example.output or []), "rerun the README example"


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", sorted(PARSED))
def test_docs_links_resolve(page: str) -> None:
    base = (ROOT / page).parent
    text = FENCE.sub("", PARSED[page].text)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#")[0]
        assert (base / path).exists(), f"{page}: broken link {target}"


def test_docs_index_lists_every_page() -> None:
    index = PARSED["docs/README.md"].text
    for name in PARSED:
        if name.startswith("docs/") and name != "docs/README.md":
            assert f"({Path(name).name})" in index, f"docs/README.md does not link {name}"
