"""The import graph keeps the layering: engine and hardware are leaves, results sits below sweep.

    sweep  ->  results, engine, hardware
    results -> engine, hardware (never sweep)
    engine, hardware: nothing of ours but their own modules (relative imports)

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
PACKAGES = ("engine", "hardware", "results", "sweep")
"""Top-level folders that are the trainmem.* subpackages (pyproject [tool.setuptools])."""
OURS = ("trainmem", *PACKAGES, "bench", "tests")
"""Names that would reach our code: the namespace, and the folders themselves (importable from
the repository root under their bare names)."""

LEAVES = ("engine", "hardware")
ALLOWED_BY_PACKAGE = {"results": ("trainmem.engine", "trainmem.hardware")}
"""Which of our packages a non-leaf may import (sweep, the top, may import any)."""


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


def test_results_never_imports_sweep() -> None:
    offenders = []
    for path in _sources("results"):
        depth = len(path.relative_to(ROOT / "results").parts)
        for level, module in _imports(path):
            escapes = level > depth  # `from ..x import` leaves results/
            absolute_ours = level == 0 and _is_ours(module)
            allowed = module.startswith(ALLOWED_BY_PACKAGE["results"])
            if escapes or (absolute_ours and not allowed):
                offenders.append(f"{path.relative_to(ROOT)}: {'.' * level}{module}")
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


@pytest.mark.parametrize(
    ("package", "may_load"),
    [
        ("trainmem.engine", ()),
        ("trainmem.hardware", ()),
        ("trainmem.results", ("trainmem.engine", "trainmem.hardware")),
    ],
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
    loaded = {m.split(".")[1] for m in result.stdout.split()}
    allowed = {package.split(".")[1]} | {m.split(".")[1] for m in may_load}
    assert loaded <= allowed, loaded - allowed
