"""`trainmem check`'s options, declared once (the CLI, `POST /v1/check` and `trainmem.check`):
check's own (`--stack`, `--fleet`, `--fix`, `--json`) and every estimate option, unset by
default, so that a flag given overrides the files (its origin is then `flag`) and one not given
leaves them be."""

from __future__ import annotations

import dataclasses

from trainmem.report import AS_JSON, ESTIMATE_OPTIONS, Option

from ._check import STACK_CHOICES

STACK = Option(
    name="stack",
    type=str,
    default="auto",
    choices=STACK_CHOICES,
    help="The stack the files are for (auto: told from each file's keys).",
)
FLEET = Option(
    name="fleet",
    type=str | None,
    default=None,
    help="One pool, COUNTxGPU (8xh100): the GPU and --num-gpus together.",
)
FIX = Option(
    name="fix",
    type=bool,
    default=False,
    flag="--fix",
    help="When it does not fit: the smallest edit to the files' own keys that makes it fit.",
)
KEPT_DEFAULTS = ("headroom", "per_stage")
"""estimate options whose default check keeps (they are not read from files)."""


def _unset(option: Option) -> Option:
    if option.name in KEPT_DEFAULTS:
        return option
    kind = option.type if option.default is None else option.type | None
    return dataclasses.replace(option, type=kind, default=None)


CHECK_OPTIONS: tuple[Option, ...] = (
    STACK,
    FLEET,
    FIX,
    *(_unset(o) for o in ESTIMATE_OPTIONS if o.name not in ("as_json", "check")),
    AS_JSON,
)
"""`trainmem check FILE ...`, `POST /v1/check`, `trainmem.check`."""
