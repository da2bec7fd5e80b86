"""Bounded searches: the work a search will take, checked before it starts, and an Optuna study
that never evaluates one layout twice.

An exhaustive search takes `Space.num_points` points, refused above MAX_POINTS. An Optuna
study's trials are layouts (`num_layouts`): `--trials` above the space's layouts is clamped with
a note (the study would otherwise ask for ever once every layout is stored), refused above
MAX_TRIALS. A sampler (TPE, NSGA-II) proposes layouts it has already seen (300 trials stored
54,000 rows for 11,340 distinct configurations, seen before this module); `fresh_trials`
tells such a trial FAIL unevaluated (its value is the first trial's, already told) and enqueues
a layout no trial has, so the study still ends with `trials` distinct layouts.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._axes import CATEGORICAL_AXES, INNER_AXES
from ._space import AXES, Space

MAX_POINTS = 1_000_000_000
"""Most points an exhaustive search takes: about half an hour on one core at the ~600,000
points/s measured here (86,400 points of llama-3.1-8b on 8 x H100 in 0.15 s)."""
MAX_TRIALS = 100_000
"""Most trials an Optuna study takes (each one engine call of its inner points; TPE's own cost
grows with the trials told)."""
OUTER_AXES = tuple(a for a in AXES if a not in INNER_AXES)
"""The axes of a layout, which a trial samples (the inner ones it enumerates)."""
DUPLICATE_ATTR = "trainmem_duplicate_of"
"""Trial user attribute on a trial told FAIL unevaluated: the layout's parameters it repeats."""
ENUMERATE_BELOW = 2_000_000
"""Layout counts up to which a replacement is found by walking every layout once random draws
keep hitting stored ones (a nearly exhausted space)."""
RANDOM_DRAWS = 64


def num_layouts(space: Space) -> int:
    """The distinct layouts of `space`: the product of its OUTER_AXES' value counts."""
    return int(np.prod([len(space.axes[a]) for a in OUTER_AXES], dtype=np.int64))


def check_points(space: Space) -> None:
    """ValueError ("space: ...") when an exhaustive search of `space` exceeds MAX_POINTS."""
    if space.num_points > MAX_POINTS:
        raise ValueError(
            f"space: {space.num_points:,} points exceed the exhaustive search's cap of "
            f"{MAX_POINTS:,}; narrow it (--max-pp, --max-cp, --max-micro-batch-size, a smaller "
            "fleet, or pin fields) or use --method optuna"
        )


def bounded_trials(space: Space, trials: int) -> int:
    """`trials`, clamped to the space's layouts (a note on stderr says so), refused above
    MAX_TRIALS (ValueError naming trials)."""
    layouts = num_layouts(space)
    if trials > layouts:
        print(
            f"note: trials: the space has {layouts:,} layouts; --trials {trials:,} clamped to "
            f"{layouts:,}",
            file=sys.stderr,
            flush=True,
        )
        trials = layouts
    if trials > MAX_TRIALS:
        raise ValueError(
            f"trials: must be <= {MAX_TRIALS:,} (an Optuna study's cap), got {trials:,}"
        )
    return trials


def layout_key(params: Mapping[str, Any]) -> tuple[Any, ...]:
    """A trial's layout as a hashable key (its parameters by OUTER_AXES; absent: None)."""
    return tuple(params.get(a) for a in OUTER_AXES)


def _layout_params(space: Space, index: Sequence[Any]) -> dict[str, Any]:
    """The Optuna parameters of the layout at `index` (one value index per OUTER_AXES axis),
    as `_optuna._suggest` draws them: a category's value, else the index (one-value axes are
    not parameters)."""
    params: dict[str, Any] = {}
    for axis, i in zip(OUTER_AXES, index, strict=True):
        values = space.axes[axis]
        if axis in CATEGORICAL_AXES:
            value = values[int(i)]
            params[axis] = value.item() if isinstance(value, np.generic) else value
        elif len(values) > 1:
            params[axis] = int(i)
    return params


def unseen_layout(
    space: Space, seen: set[tuple[Any, ...]], *, rng: np.random.Generator
) -> dict[str, Any] | None:
    """The parameters of a layout whose key is not in `seen` (random draws, then, for a space
    of at most ENUMERATE_BELOW layouts, a walk from a random start), or None (none found)."""
    shape = tuple(len(space.axes[a]) for a in OUTER_AXES)
    total = num_layouts(space)
    for flat in rng.integers(0, total, size=RANDOM_DRAWS):
        params = _layout_params(space, np.unravel_index(int(flat), shape))
        if layout_key(params) not in seen:
            return params
    if total > ENUMERATE_BELOW:
        return None
    start = int(rng.integers(0, total))
    for flat in (*range(start, total), *range(start)):
        params = _layout_params(space, np.unravel_index(flat, shape))
        if layout_key(params) not in seen:
            return params
    return None


def fresh_trials(space: Space, st: Any, batch: list[Any], *, seed: int | None) -> list[bool]:
    """Per trial of `batch` (parameters suggested, not yet told): whether its layout is new.

    A layout is taken when a COMPLETE or RUNNING trial outside the batch has it, or an earlier
    trial of the batch. A taken one is told FAIL unevaluated (DUPLICATE_ATTR names it), and a
    layout no trial has is enqueued in its place (`unseen_layout`, seeded by `seed` and the
    trial's number), which the next ask takes.
    """
    from optuna.trial import TrialState

    numbers = {t.number for t in batch}
    others = st.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
    seen = {layout_key(t.params) for t in others if t.number not in numbers}
    fresh = []
    for t in batch:
        key = layout_key(t.params)
        if key not in seen:
            seen.add(key)
            fresh.append(True)
            continue
        fresh.append(False)
        t.set_user_attr(DUPLICATE_ATTR, dict(t.params))
        st.tell(t, state=TrialState.FAIL, skip_if_finished=True)
        rng = np.random.default_rng([0 if seed is None else seed, t.number])
        replacement = unseen_layout(space, seen, rng=rng)
        if replacement is not None:
            seen.add(layout_key(replacement))  # not twice from this batch
            st.enqueue_trial(replacement)
    return fresh
