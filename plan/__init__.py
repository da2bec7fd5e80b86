"""trainmem.plan: recommendations (the best plan for a job on a fleet) and launch configs.

`recommend_report` searches the sweep's space restricted to what a framework launches;
`render` writes a plan as a DeepSpeed config, a torchrun line, an sbatch script or an accelerate
FSDP config.
"""

from ._launch import DEFAULT_FRAMEWORK, FORMATS, check_format, deepspeed_config, render
from ._recommend import (
    RECOMMEND_OPTIONS,
    REPORT_FIELDS,
    recommend_report,
    space_points,
    summary,
)

__all__ = [
    "RECOMMEND_OPTIONS",
    "DEFAULT_FRAMEWORK",
    "FORMATS",
    "REPORT_FIELDS",
    "check_format",
    "deepspeed_config",
    "recommend_report",
    "render",
    "space_points",
    "summary",
]
