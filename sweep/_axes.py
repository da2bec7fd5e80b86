"""The search axes, derived from the training fields' declarations (engine TrainingConfig).

A field declared with `sweep_axis=True` is searched: it is an axis of the space (`AXES`, in the
order of the flat point index), an Optuna parameter or an inner axis of every trial
(`LAYOUT_AXES` / `INNER_AXES`, from its `layout` attribute), a column of the sweep's and
recommend's tables (`SHOW`, headed by its `heading`) and a heatmap axis of stored points. No
other list of the axes is kept by hand: the declaration's attributes say what each list needs
(`layout`, `axis_order`, `axis_values`, `heading`).
"""

from __future__ import annotations

import math
from typing import Any

from trainmem.engine import FIELD_NAMES, KNOBS, SWEEP_AXES, TYPES


def _axis_key(name: str) -> tuple[bool, float, int]:
    """Layout axes first, then by declared `axis_order` (unnumbered last), then declaration."""
    knob = KNOBS[name]
    order = math.inf if knob.axis_order is None else knob.axis_order
    return (not knob.layout, order, FIELD_NAMES.index(name))


SEARCHED: tuple[str, ...] = tuple(sorted(SWEEP_AXES, key=_axis_key))
"""The searched training fields, slowest-varying first."""
AXES: tuple[str, ...] = ("pool", *SEARCHED)
"""The swept fields, slowest-varying first (the order of the flat point index); `pool` (which
pool of the fleet, hence the GPU type) leads."""
LAYOUT_AXES: tuple[str, ...] = ("pool", *(a for a in SEARCHED if KNOBS[a].layout))
"""The axes of a point's parallel layout: the GPU pool and the `layout` fields (GPU count and
the degrees that place ranks; dp follows). They lead AXES, so the points of one layout are
consecutive flat indices."""
INNER_AXES: tuple[str, ...] = tuple(a for a in SEARCHED if not KNOBS[a].layout)
"""The memory knobs chosen within a layout: each Optuna trial enumerates them in full."""
LAYOUT: tuple[str, ...] = ("gpu", *LAYOUT_AXES[1:])
"""The points table's columns of a layout (the pool as its GPU)."""
NAMED_AXES: dict[str, tuple[str, ...]] = {
    a: KNOBS[a].choices for a in SEARCHED if KNOBS[a].choices is not None
}
"""Axes whose values are names, with their vocabularies (a value's code is its index)."""
CATEGORICAL_AXES: tuple[str, ...] = ("pool", *NAMED_AXES)
"""Axes Optuna suggests as categories; the others are ordered (an index into the sorted
values), so TPE's kernels see that tp 4 lies between 2 and 8."""
SHOW: tuple[str, ...] = ("gpu", *LAYOUT_AXES[1:], "dp", *INNER_AXES, "grad_accum_steps")
"""A point's configuration as the sweep shows it: its layout, dp (which the layout decides), the
knobs chosen within it, and the gradient accumulation (which the micro-batch decides)."""

RL_AXES: tuple[str, ...] = tuple(a for a in SEARCHED if KNOBS[a].rl_axis)
"""The axes searched only for an RL job (their declaration's rl_axis): the rollout engine's tp,
the reference model's placement, the RL trainer's offload between phases."""


def shown_columns(columns: tuple[str, ...], *, rl: bool) -> tuple[str, ...]:
    """A table's columns for a job: without RL, none of the RL axes (each is its default)."""
    return columns if rl else tuple(c for c in columns if c not in RL_AXES)


DERIVED_HEADINGS = {"gpu": "gpu", "num_nodes": "nodes", "dp": "dp", "grad_accum_steps": "accum"}
"""Headings of the table columns that are not training fields."""


def heading(column: str) -> str:
    """A table column's heading: the field's declared `heading`, else its name."""
    if column in DERIVED_HEADINGS:
        return DERIVED_HEADINGS[column]
    return KNOBS[column].heading or column


def declared_values(axis: str) -> tuple[Any, ...]:
    """An axis's candidate values from its declaration: `axis_values`, else its choices, else
    off and on for a switch; ValueError for a field that declares none of them (a number the
    space has no rule for)."""
    knob = KNOBS[axis]
    if knob.axis_values is not None:
        return tuple(knob.axis_values)
    if knob.choices is not None:
        return tuple(knob.choices)
    if TYPES[axis] is bool:
        return (False, True)
    raise ValueError(f"{axis}: a search axis needs axis_values in its declaration")
