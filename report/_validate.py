"""Checks of command-line values shared by every command: one-line ValueErrors (exit code 2)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainmem.engine import KNOBS, bound_reason, cross_field_reason

from ._options import Option

VOCABULARIES: dict[str, tuple[str, ...]] = {
    name: knob.choices
    for name, knob in KNOBS.items()
    if knob.choices is not None and not knob.open_choices
}
"""The closed vocabularies of the training fields (TrainingConfig), by field; optimizers are
open (built-in or user files: see optimizer_columns)."""


def choice(field: str, value: str, allowed: tuple[str, ...]) -> str:
    """`value` if it is one of `allowed`, else a ValueError naming the field and the choices."""
    if value not in allowed:
        raise ValueError(f"{field}: unknown value '{value}'; allowed: {', '.join(allowed)}")
    return value


def check_choices(values: Mapping[str, str]) -> None:
    """`choice` for each named field of VOCABULARIES, in the order given."""
    for field, value in values.items():
        choice(field, value, VOCABULARIES[field])


def check_headroom(headroom: float) -> float:
    """The fraction of usable memory kept free: in [0, 1)."""
    if not 0.0 <= headroom < 1.0:  # NaN fails too
        raise ValueError(f"headroom: must be in [0, 1), got {headroom}")
    return headroom


def check_options(options: Sequence[Option], values: Mapping[str, Any]) -> None:
    """ValueError naming the first option (declaration order) whose value is outside its
    choices (closed training vocabularies first), then outside its bounds (`ge`/`le`/`gt`/
    `lt`; NaN and infinities are outside), then a broken cross-field rule of the training
    fields. Options absent from `values` or None are not judged."""
    given = {o.name: values[o.name] for o in options if values.get(o.name) is not None}
    for o in options:
        if o.name in VOCABULARIES and o.name in given:
            choice(o.name, given[o.name], VOCABULARIES[o.name])
    for o in options:
        if o.name in given:
            reason = bound_reason(given[o.name], ge=o.ge, le=o.le, gt=o.gt, lt=o.lt)
            if reason:  # a flag spelled unlike the name is named too (--max-step-time)
                dashed = "--" + o.name.replace("_", "-")
                also = f" ({o.flag})" if o.flag and o.flag != dashed else ""
                raise ValueError(f"{o.name}{also}: {reason}")
    reason = cross_field_reason({k: v for k, v in given.items() if k in KNOBS})
    if reason:
        raise ValueError(reason)
