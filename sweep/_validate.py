"""Checks of command-line values shared by every command: one-line ValueErrors (exit code 2)."""

from __future__ import annotations


def choice(field: str, value: str, allowed: tuple[str, ...]) -> str:
    """`value` if it is one of `allowed`, else a ValueError naming the field and the choices."""
    if value not in allowed:
        raise ValueError(f"{field}: unknown value '{value}'; allowed: {', '.join(allowed)}")
    return value


def check_headroom(headroom: float) -> float:
    """The fraction of usable memory kept free: in [0, 1)."""
    if not 0.0 <= headroom < 1.0:
        raise ValueError(f"headroom: must be in [0, 1), got {headroom}")
    return headroom
