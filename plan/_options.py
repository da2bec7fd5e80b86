"""`trainmem recommend`'s options, declared apart from the search: the command line registers
`recommend` (and lists it in --help) without importing the searches."""

from __future__ import annotations

from trainmem.engine import SWEEP_AXES
from trainmem.report import (
    AS_JSON,
    CHECK,
    FAMILY,
    HEADROOM,
    MODEL,
    USER_DIRS,
    Option,
    training_options,
)
from trainmem.sweep import FLEET, SEARCH_DEFAULTS, SEARCH_OPTIONS

from ._launch import FORMATS

RECOMMEND_OPTIONS: tuple[Option, ...] = (
    MODEL,
    FAMILY,
    FLEET,
    *training_options(
        defaults=SEARCH_DEFAULTS,
        exclude=("sequence_parallel",),
        optional=(*SWEEP_AXES, "framework"),
    ),
    Option(
        name="fmt",
        type=str | None,
        default=None,
        flag="--format",
        http=False,
        choices=FORMATS,
        help=" | ".join(FORMATS) + " (default: a summary).",
    ),
    AS_JSON,
    CHECK,
    Option(
        name="num_alternatives",
        type=int,
        default=4,
        ge=0,
        le=64,
        help="Runners-up (distinct layouts).",
    ),
    *SEARCH_OPTIONS,
    HEADROOM,
    Option(
        name="script",
        type=str | None,
        default=None,
        help="Training script of torchrun/slurm (pretrain_gpt.py, train.py).",
    ),
    Option(
        name="job_name", type=str, default="trainmem", help="slurm --job-name, torchrun --rdzv-id."
    ),
    Option(name="time_limit", type=str, default="24:00:00", help="slurm --time."),
    *USER_DIRS,
)
"""`trainmem recommend`, `POST /v1/recommend`, `trainmem.recommend`. `framework` unset: the
launch format's (megatron for json); a searched field given pins its axis."""
