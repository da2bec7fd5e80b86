"""Checks of command-line values shared by every command: one-line ValueErrors (exit code 2)."""

from __future__ import annotations

from collections.abc import Mapping

from trainmem.engine import KNOBS

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
    if not 0.0 <= headroom < 1.0:
        raise ValueError(f"headroom: must be in [0, 1), got {headroom}")
    return headroom
