"""The import graph keeps the layering: every arrow points one way (down this table).

    cli      -> anything below (the command line; nothing imports it)
    serve    -> stacks, plan, sweep, report, results, engine, hardware (the HTTP face)
    api      -> stacks, plan, sweep, trace, report, results, engine, hardware (`import trainmem`)
    plan     -> sweep, report, results, engine, hardware (recommendations, launch configs)
    stacks   -> report, catalog, engine, hardware (`check`: a job's own config files read)
    trace    -> report, engine, hardware (fake-tensor training steps)
    sweep    -> report, results, engine, hardware (space, searches, fit)
    report   -> engine, hardware (one configuration's answer)
    results  -> engine, hardware (points table, store, plots)
    catalog  -> engine, hardware (model presets, config.json, user optimizers, profiles: files
                -> specs; hardware's bounded file reader)
    engine, hardware: nothing of ours but their own modules (relative imports)
    bench    -> tests (ground truth, generated tables), any package; tests never import bench

Checked statically (every import statement, also inside functions, and literal names passed to
importlib.import_module / __import__) and at run time (what importing a package loads).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
FOLDERS = {
    "api": "trainmem",
    "catalog": "trainmem.catalog",
    "cli": "trainmem.cli",
    "engine": "trainmem.engine",
    "hardware": "trainmem.hardware",
    "plan": "trainmem.plan",
    "report": "trainmem.report",
    "results": "trainmem.results",
    "serve": "trainmem.serve",
    "stacks": "trainmem.stacks",
    "sweep": "trainmem.sweep",
    "trace": "trainmem.trace",
}
"""Top-level folders and the package each is installed as (pyproject [tool.setuptools])."""
PACKAGES = tuple(FOLDERS)
OURS = ("trainmem", *PACKAGES, "bench", "tests")
"""Names that would reach our code: the namespace, and the folders themselves (importable from
the repository root under their bare names)."""

LEAVES = ("engine", "hardware")
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "engine": (),
    "hardware": (),
    "catalog": ("engine", "hardware"),
    "results": ("engine", "hardware"),
    "report": ("catalog", "engine", "hardware"),
    "sweep": ("report", "results", "catalog", "engine", "hardware"),
    "trace": ("report", "catalog", "engine", "hardware"),
    "plan": ("sweep", "report", "results", "catalog", "engine", "hardware"),
    "stacks": ("report", "catalog", "engine", "hardware"),
    "api": (
        "stacks",
        "plan",
        "sweep",
        "trace",
        "report",
        "results",
        "catalog",
        "engine",
        "hardware",
    ),
    "serve": ("stacks", "plan", "sweep", "report", "results", "catalog", "engine", "hardware"),
    "cli": (
        "serve",
        "stacks",
        "plan",
        "sweep",
        "trace",
        "report",
        "results",
        "catalog",
        "engine",
        "hardware",
    ),
}
"""Which of our packages each may import (the arrows of the picture above)."""


def _imports(path: Path) -> list[tuple[int, str]]:
    """(level, module) for every import in a file; level 0 = absolute."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend((0, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or ""))
        elif (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id == "__import__")
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            name = node.args[0].value
            found.append((len(name) - len(name.lstrip(".")), name.lstrip(".")))
    return found


def _is_ours(module: str) -> bool:
    return module.split(".")[0] in OURS


def _sources(package: str) -> list[Path]:
    paths = sorted((ROOT / package).rglob("*.py"))
    assert paths, f"no sources under {package}/"
    return paths


@pytest.mark.parametrize("package", LEAVES)
def test_leaf_packages_import_only_their_own_modules(package: str) -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {'.' * level}{module}"
        for path in _sources(package)
        for level, module in _imports(path)
        if (level == 0 and _is_ours(module))
        # a relative import may not climb out of the package: level 1 from its top folder,
        # one more per subfolder
        or level > len(path.relative_to(ROOT / package).parts)
    ]
    assert not offenders


def _package_of(module: str) -> str | None:
    """The folder an absolute import of ours lands in (None: not ours, or the bare namespace)."""
    parts = module.split(".")
    if parts[0] != "trainmem":
        return parts[0] if parts[0] in PACKAGES else None
    if len(parts) == 1:
        return "api"
    return parts[1] if parts[1] in PACKAGES else "api"


def test_the_arrows_point_one_way() -> None:
    """The allowed imports form a DAG (no package reaches itself through others)."""
    order: list[str] = []
    todo = dict(MAY_IMPORT)
    while todo:
        ready = [p for p, deps in todo.items() if all(d in order for d in deps)]
        assert ready, f"cycle among {sorted(todo)}"
        order.extend(sorted(ready))
        for p in ready:
            del todo[p]
    assert set(MAY_IMPORT) == set(PACKAGES)


@pytest.mark.parametrize("package", [p for p in PACKAGES if p not in LEAVES])
def test_each_package_imports_only_what_the_layering_allows(package: str) -> None:
    offenders = []
    for path in _sources(package):
        depth = len(path.relative_to(ROOT / package).parts)
        for level, module in _imports(path):
            if level > depth:  # `from ..x import` leaves the package
                offenders.append(f"{path.relative_to(ROOT)}: {'.' * level}{module}")
            elif level == 0 and _is_ours(module):
                target = _package_of(module)
                if target != package and target not in MAY_IMPORT[package]:
                    offenders.append(f"{path.relative_to(ROOT)}: {module}")
    assert not offenders


def test_no_package_imports_bench_or_tests() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {module}"
        for package in PACKAGES
        for path in _sources(package)
        for level, module in _imports(path)
        if level == 0 and module.split(".")[0] in ("bench", "tests")
    ]
    assert not offenders


def test_tests_never_import_bench() -> None:
    """bench/ may use tests/ (ground truth, generated tables), never the reverse: no cycle."""
    offenders = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for level, module in _imports(path)
        if level == 0 and module.split(".")[0] == "bench"
    ]
    assert not offenders


@pytest.mark.parametrize(
    ("package", "may_load"),
    [(FOLDERS[p], tuple(FOLDERS[d] for d in MAY_IMPORT[p])) for p in PACKAGES if p != "api"],
)
def test_importing_a_package_loads_only_what_the_layering_allows(
    package: str, may_load: tuple[str, ...]
) -> None:
    code = (
        f"import sys, {package}; "
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('trainmem.'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT.parent
    )
    loaded = {_package_of(m) for m in result.stdout.split()}
    allowed = {_package_of(package)} | {_package_of(m) for m in may_load} | {"api"}
    assert loaded <= allowed, loaded - allowed


def import_picture() -> str:
    """The allowed imports as a mermaid graph, each arrow implied by others left out."""

    def reach(package: str) -> set[str]:
        out: set[str] = set()
        for dep in MAY_IMPORT[package]:
            out |= {dep} | reach(dep)
        return out

    lines = ["```mermaid", "graph TD"]
    for package in PACKAGES:
        deps = MAY_IMPORT[package]
        implied = set().union(*(reach(d) for d in deps)) if deps else set()
        lines += [f"  {package} --> {dep}" for dep in deps if dep not in implied]
    return "\n".join([*lines, "```"])


def test_the_docs_picture_of_imports_is_the_allowed_graph() -> None:
    """docs/contributing.md shows the arrows this test enforces (generated, not drawn)."""
    text = (ROOT / "docs" / "contributing.md").read_text()
    begin, end = "<!-- imports:begin -->", "<!-- imports:end -->"
    shown = text.split(begin)[1].split(end)[0].strip()
    assert shown == import_picture(), f"put this between the markers:\n{import_picture()}"
