"""hardware/ is a leaf package: it imports nothing from trainmem's other packages."""

from __future__ import annotations

import ast
from pathlib import Path

HARDWARE_DIR = Path(__file__).parents[3] / "hardware"
FORBIDDEN = ("trainmem.engine", "trainmem.sweep", "trainmem.results")


def _imported_modules(path: Path) -> list[str]:
    modules: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.append(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 1:
            modules.append("." * node.level + (node.module or ""))  # reaches above hardware/
    return modules


def test_hardware_imports_no_sibling_package() -> None:
    offenders = {
        f"{path.name}: {module}"
        for path in HARDWARE_DIR.rglob("*.py")
        for module in _imported_modules(path)
        if module.startswith(FORBIDDEN) or module.startswith("..")
    }
    assert not offenders
