"""trainmem.plan: recommendations (the best plan for a job on a fleet) and launch configs.

`recommend_report` searches the sweep's space restricted to what a framework launches;
`render` writes a plan as a DeepSpeed config, a torchrun line, an sbatch script or an accelerate
FSDP config. The search's names (recommend_report, REPORT_FIELDS, space_points, summary) load
their module, and the searches behind it, when first used.
"""

from typing import TYPE_CHECKING

from trainmem.engine._lazy import lazy_names

from ._launch import (
    DEFAULT_FRAMEWORK,
    FORMATS,
    check_format,
    deepspeed_config,
    format_framework,
    render,
    replan_line,
    replan_note,
    replans,
)
from ._options import RECOMMEND_OPTIONS

if TYPE_CHECKING:  # pragma: no cover
    from ._recommend import REPORT_FIELDS, recommend_report, space_points, summary

_RECOMMEND_NAMES = ("REPORT_FIELDS", "recommend_report", "space_points", "summary")
"""Names of plan/_recommend.py (it imports the searches: polars)."""

__all__ = [
    "RECOMMEND_OPTIONS",
    "DEFAULT_FRAMEWORK",
    "FORMATS",
    "REPORT_FIELDS",
    "check_format",
    "deepspeed_config",
    "format_framework",
    "recommend_report",
    "render",
    "replan_line",
    "replan_note",
    "replans",
    "space_points",
    "summary",
]


__getattr__ = lazy_names(__name__, dict.fromkeys(_RECOMMEND_NAMES, "._recommend"))
