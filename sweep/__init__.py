"""trainmem.sweep: the search over a fleet's configuration space.

The space (`make_space`: axes of candidate values, enumerated lazily as columnar grids), the
exhaustive and Optuna searches (`run_exhaustive`, `run_optuna`; every point stored as Parquet),
`fit_report` (the largest micro-batch or fewest GPUs that fits) and the heatmap's cells.
"""

from ._fit import fit_report
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
