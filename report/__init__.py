"""trainmem.report: one configuration's answer as a JSON-able dict, and its human table.

`estimate_report` is `trainmem estimate --json`; `row_report`, `time_report` and `advice_report`
are the blocks that fit, recommend and the HTTP service reuse. Imports engine and hardware only.
"""

from ._advice import advice_lines, advice_report, gpu_choice
from ._estimate import (
    DEFAULT_MODEL,
    MINIMIZE,
    OUTPUT_FIELDS,
    check_layout,
    command_defaults,
    command_fields,
    estimate_report,
    jsonable,
    key_numbers,
    model_spec,
    traced_choices,
    training_config,
)
from ._options import (
    AS_JSON,
    CHECK,
    ESTIMATE_OPTIONS,
    EXIT_CODES,
    GPU,
    HEADROOM,
    HOST_MEMORY_GIB,
    MODEL,
    PROFILE_FILE,
    USER_DIRS,
    Option,
    gib_to_bytes,
    option_defaults,
    training_options,
)
from ._row import human_table, row_report, stage_summary, time_line, time_report
from ._validate import VOCABULARIES, check_choices, check_headroom, check_options, choice

__all__ = [
    "AS_JSON",
    "CHECK",
    "EXIT_CODES",
    "GPU",
    "HEADROOM",
    "HOST_MEMORY_GIB",
    "MODEL",
    "PROFILE_FILE",
    "USER_DIRS",
    "ESTIMATE_OPTIONS",
    "Option",
    "gib_to_bytes",
    "option_defaults",
    "training_options",
    "training_config",
    "DEFAULT_MODEL",
    "MINIMIZE",
    "OUTPUT_FIELDS",
    "VOCABULARIES",
    "advice_lines",
    "advice_report",
    "check_choices",
    "check_headroom",
    "check_options",
    "check_layout",
    "choice",
    "command_defaults",
    "command_fields",
    "estimate_report",
    "gpu_choice",
    "human_table",
    "jsonable",
    "key_numbers",
    "model_spec",
    "row_report",
    "stage_summary",
    "time_line",
    "time_report",
    "traced_choices",
]
