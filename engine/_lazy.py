"""Package attributes imported from their modules on first use (PEP 562 module __getattr__):
the command line lists and runs a command without importing what the others need. Here, at the
bottom of the layering, so that engine, results, sweep and plan share it (hardware, the other
leaf, keeps its own few lines)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, module_of: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level __getattr__ for `package`: each name of `module_of` (name -> relative
    module) is imported from its module when first asked for, then kept on the package."""

    def __getattr__(name: str) -> Any:
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module_of[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


def modules_of(modules: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    """{name: module} from {module: its names}."""
    return {name: module for module, names in modules.items() for name in names}
