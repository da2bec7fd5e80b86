"""The searches' former module, kept as an import path: `_run` imports the verbs from here.

The exhaustive search lives in `_exhaustive`, the Optuna one in `_optuna`, what they share
(objectives, the result, the points frame, the ranking) in `_points`; patch a name in the
module that defines it.
"""

from ._exhaustive import run_exhaustive
from ._optuna import run_optuna
from ._points import OBJECTIVES, Progress, SearchResult, parse_objectives

__all__ = [
    "OBJECTIVES",
    "Progress",
    "SearchResult",
    "parse_objectives",
    "run_exhaustive",
    "run_optuna",
]
