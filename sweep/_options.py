"""The options every search takes (sweep, recommend), declared once (trainmem.report.Option)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainmem.engine import FIELD_NAMES
from trainmem.report import Option

SEARCH_DEFAULTS = {
    "seq_len": 4096,
    "global_batch_size": 256,
    "precision": "mixed-bf16",
    "framework": "megatron",
}
"""Training-field defaults of a search (sweep, recommend): Megatron's mixed bf16 at 4k tokens.
Sequence parallelism is on in every search point (not an option there)."""
JOB_FIELDS = ("seq_len", "global_batch_size", "precision", "optimizer", "framework")
"""Training fields a search space always takes; the others fix or pin it only when given."""
SEARCH_OPTIONS: tuple[Option, ...] = (
    Option(name="objective", type=str, default="cost", help="cost | time | gpus"),
    Option(
        name="max_micro_batch_size",
        type=int,
        default=16,
        ge=1,
        le=1 << 16,
        help="Largest micro-batch tried.",
    ),
    Option(
        name="max_pp", type=int, default=16, ge=1, le=1024, help="Largest pipeline degree tried."
    ),
    Option(
        name="max_cp",
        type=int,
        default=4,
        ge=1,
        le=1024,
        help="Largest context-parallel degree tried.",
    ),
)
FLEET = Option(
    name="fleet",
    type=str,
    default="8xh100-sxm-80gb",
    help="COUNTxGPU[,COUNTxGPU...] or a fleet TOML file.",
)


def extra_fields(job: Mapping[str, Any]) -> dict[str, Any]:
    """The job's training fields beyond JOB_FIELDS that fix or pin the space (None: searched;
    sequence_parallel: on in every search)."""
    fixed = (*JOB_FIELDS, "sequence_parallel")
    return {k: v for k, v in job.items() if k in FIELD_NAMES and k not in fixed and v is not None}
