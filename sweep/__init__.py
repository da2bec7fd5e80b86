"""trainmem.sweep: the search over a fleet's configuration space.

The space (`make_space`: axes of candidate values, enumerated lazily as columnar grids), the
exhaustive and Optuna searches (`run_exhaustive`, `run_optuna`; every point stored as Parquet),
`fit_report` (the largest micro-batch or fewest GPUs that fits) and the heatmap's cells.

Called, the package runs a sweep: `trainmem.sweep(model=..., fleet=..., out=None)` is
`run_sweep(...)` (returns a SweepRun: the SearchResult, the space, the study name).
"""

import sys as _sys
import types as _types
from typing import Any

from ._fit import FIT_OPTIONS, fit_report
from ._options import FLEET, JOB_FIELDS, SEARCH_DEFAULTS, SEARCH_OPTIONS, extra_fields
from ._run import SWEEP_OPTIONS, SweepRun, run_sweep
from ._search import (
    OBJECTIVES,
    Progress,
    SearchResult,
    parse_objectives,
    run_exhaustive,
    run_optuna,
)
from ._space import AXES, Space, evaluate_columns, gpu_counts, make_space, reason_texts

__all__ = [
    "SWEEP_OPTIONS",
    "SweepRun",
    "run_sweep",
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


class _CallableSweep(_types.ModuleType):
    """`trainmem.sweep` is this package and, called, the sweep verb.

    `trainmem.sweep(...)` runs `run_sweep(...)` (a package attribute of `trainmem` cannot be both
    otherwise).
    """

    def __call__(self, *args: Any, **kwargs: Any) -> SweepRun:
        return run_sweep(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallableSweep
