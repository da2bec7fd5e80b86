"""trainmem.sweep: the search over a fleet's configuration space.

The space (`make_space`: axes of candidate values, enumerated lazily as columnar grids), the
exhaustive and Optuna searches (`run_exhaustive`, `run_optuna`; every point stored as Parquet),
`fit_report` (the largest micro-batch or fewest GPUs that fits) and the heatmap's cells.

Called, the package runs a sweep: `trainmem.sweep(model=..., fleet=..., out=None)` is
`sweep_report(...)`: the dict `trainmem sweep --json` prints (a SweepReport, which also answers
the SweepRun's `result`, `space`, `study`, `objectives` and `why`, as `run_sweep` returns).

Each name is imported from its module when first used: `fit_report` does not load the searches
(polars, Optuna).
"""

import sys as _sys
import types as _types
from typing import TYPE_CHECKING, Any

from trainmem.engine._lazy import lazy_names, modules_of

if TYPE_CHECKING:  # pragma: no cover
    from ._exhaustive import run_exhaustive
    from ._fit import FIT_OPTIONS, fit_report
    from ._options import (
        FLEET,
        JOB_FIELDS,
        SEARCH_DEFAULTS,
        SEARCH_OPTIONS,
        SWEEP_OPTIONS,
        extra_fields,
    )
    from ._optuna import run_optuna
    from ._points import OBJECTIVES, Progress, SearchResult, parse_objectives
    from ._run import SweepReport, SweepRun, run_sweep, sweep_report
    from ._space import AXES, Space, evaluate_columns, gpu_counts, make_space, reason_texts

_MODULES = {
    "._fit": ("FIT_OPTIONS", "fit_report"),
    "._options": (
        "FLEET",
        "JOB_FIELDS",
        "SEARCH_DEFAULTS",
        "SEARCH_OPTIONS",
        "SWEEP_OPTIONS",
        "extra_fields",
    ),
    "._run": ("SweepReport", "SweepRun", "run_sweep", "sweep_report"),
    "._exhaustive": ("run_exhaustive",),
    "._optuna": ("run_optuna",),
    "._points": ("OBJECTIVES", "Progress", "SearchResult", "parse_objectives"),
    "._space": ("AXES", "Space", "evaluate_columns", "gpu_counts", "make_space", "reason_texts"),
}
_MODULE_OF = modules_of(_MODULES)
"""Each public name and the module that defines it."""

__all__ = [
    "SWEEP_OPTIONS",
    "SweepReport",
    "SweepRun",
    "run_sweep",
    "sweep_report",
    "FLEET",
    "JOB_FIELDS",
    "SEARCH_DEFAULTS",
    "SEARCH_OPTIONS",
    "extra_fields",
    "FIT_OPTIONS",
    "AXES",
    "OBJECTIVES",
    "Progress",
    "SearchResult",
    "Space",
    "evaluate_columns",
    "fit_report",
    "gpu_counts",
    "make_space",
    "parse_objectives",
    "reason_texts",
    "run_exhaustive",
    "run_optuna",
]


__getattr__ = lazy_names(__name__, _MODULE_OF)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _CallableSweep(_types.ModuleType):
    """`trainmem.sweep` is this package and, called, the sweep verb.

    `trainmem.sweep(...)` runs `sweep_report(...)` (a package attribute of `trainmem` cannot be
    both otherwise): what `trainmem sweep --json` prints, with the SweepRun's attributes.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> "SweepReport":
        from ._run import sweep_report

        return sweep_report(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallableSweep
