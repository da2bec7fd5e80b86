"""estimate_time_one(): one configuration's step time as Python floats, for the callers that ask
one at a time (the public report, the HTTP service).

estimate_time() on a grid of one row costs about 0.6 ms: hundreds of numpy calls on arrays of
one element. Here the engine's own step-time function (engine/_time.time_values) is traced once
per model and set of time constants (engine/_fast/_formula_trace.py: every numpy operation
recorded with the dtype numpy gives it; the row's grid fields, the GPU's rates and `tokens`
symbolic), rendered as a plain-Python program by the generator of the layout rules and peaks
(engine/_fast/_rows.py: numpy's dtype rules written out, NaN winning max/min, a zero divisor
giving inf/NaN), and run on the row's values. The result is the same, to the bit, as
estimate_time() on that row (tests/unit/engine/test_time_row.py).

Nothing here is a formula: editing engine/_time.py or a technique's module changes both paths.
Where the trace or the generator cannot follow the formulas (`Untraceable`, a numpy operation
without a Python form), the one-row estimate_time() answers instead.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from .._grid import make_grid
from .._model import ModelSpec
from .._time import Links, estimate_time, time_values
from .._time_params import TimeParams
from . import _rows
from ._formula_trace import Program, Untraceable, trace

LINKS = Links._fields
"""The GPU's values the step time reads (estimate_time's keyword arguments)."""
_LINK_COLUMNS = tuple(f"link_{k}" for k in LINKS)
_TOKENS = "tokens"
_F8: np.dtype = np.dtype(np.float64)


class _TimeProgram(NamedTuple):
    model: ModelSpec
    """The model the program was traced for (kept: the cache is keyed by its identity)."""
    function: Callable[..., tuple[float, ...]] | None
    """time_row(<grid values>, <links>, [tokens]) -> the columns' values; None: untraceable."""
    inputs: tuple[str, ...]
    """The grid fields the program reads, in its parameters' order (before the links)."""
    outputs: tuple[str, ...]


_programs: dict[tuple[int, TimeParams, bool, bool], _TimeProgram] = {}
_PROGRAM_LIMIT = 64
"""Programs kept (one per model, time constants, tokens given or not and RL row or not) before
starting over."""


def time_program(m: ModelSpec, params: TimeParams | None = None, *, rl: bool = True) -> Program:
    """time_values of one row of model `m`: its grid fields, the GPU's values (`link_<name>`)
    and `tokens` symbolic; an RL row's program (`rl`) or another's (its RL terms zero, not
    traced); raises Untraceable."""
    columns: dict[str, np.dtype] = {k: v.dtype for k, v in make_grid().items()}
    columns.update(dict.fromkeys((*_LINK_COLUMNS, _TOKENS), _F8))
    pr = params or TimeParams()

    def program(model: ModelSpec, c: dict[str, Any]) -> dict[str, Any]:
        links = Links(*(c[k] for k in _LINK_COLUMNS))
        return time_values(model, c, links, tokens=c[_TOKENS], params=pr, rl_rows=rl)

    return trace(program, m, columns)


def time_source(p: Program) -> tuple[str, tuple[str, ...]]:
    """The program as a Python module defining time_row(<its grid inputs>, <links>, tokens),
    and those grid inputs in order."""
    tables: dict[tuple, str] = {}
    used = set(_rows._inputs(p))
    grid = tuple(k for k, _ in p.columns if k in used and k not in (*_LINK_COLUMNS, _TOKENS))
    params = (*grid, *_LINK_COLUMNS, _TOKENS)
    body = _rows.row_function(
        p, "time_row", params, {k: k for k in params}, python=True, tables=tables
    )
    source = [_rows._PY_PRELUDE, *_rows._tables_source(tables, python=True), "", "", *body]
    return "\n".join(source) + "\n", grid


def _compile(m: ModelSpec, params: TimeParams, with_tokens: bool, rl: bool) -> _TimeProgram:
    """The program of model `m` (None where it cannot be traced or rendered)."""
    try:
        p = time_program(m, params, rl=rl)
        if not with_tokens:  # the columns estimate_time gives without `tokens`
            keep = {k: v for k, v in p.outputs.items() if k not in TOKEN_COLUMNS}
            p = p._replace(outputs=keep)
        text, grid = time_source(p)
    except (Untraceable, ValueError):
        return _TimeProgram(m, None, (), ())
    namespace: dict[str, Any] = {"__name__": "trainmem_time_row"}
    exec(compile(text, "<trainmem time row>", "exec"), namespace)
    fn = types.SimpleNamespace(**namespace).time_row
    return _TimeProgram(m, fn, grid, tuple(p.outputs))


TOKEN_COLUMNS = ("time_to_train_s", "cost_to_train_usd")
"""The columns estimate_time adds with `tokens`."""


def _program_of(m: ModelSpec, params: TimeParams, with_tokens: bool, rl: bool) -> _TimeProgram:
    key = (id(m), params, with_tokens, rl)
    program = _programs.get(key)
    if program is None or program.model is not m:
        if len(_programs) >= _PROGRAM_LIMIT:
            _programs.clear()
        program = _programs[key] = _compile(m, params, with_tokens, rl)
    return program


def estimate_time_one(
    m: ModelSpec,
    row: Mapping[str, Any],
    links: Mapping[str, float],
    *,
    tokens: float | None = None,
    params: TimeParams | None = None,
) -> dict[str, float]:
    """estimate_time() of one valid row as Python floats: `row` every grid field as
    engine/_fast/_scalar.encode_row gives it (categorical codes), `links` estimate_time's GPU
    keywords (time_inputs(profile)). The same keys and values as
    `estimate_time(m, make_grid(row), **links, tokens=tokens, params=params, reason=0)`.

    The caller has checked the layout (layout_reason 0): an invalid row's values mean nothing
    here, where estimate_time gives NaN."""
    pr = params or TimeParams()
    program = _program_of(m, pr, tokens is not None, int(row["rl"]) != 0)  # 0: rl none
    if program.function is None:
        return _fallback(m, row, links, tokens=tokens, params=pr)
    values = [row[k] for k in program.inputs]
    values += [float(v) for v in Links(**links)]
    values.append(math.nan if tokens is None else float(tokens))
    return dict(zip(program.outputs, program.function(*values), strict=True))


def _fallback(
    m: ModelSpec,
    row: Mapping[str, Any],
    links: Mapping[str, float],
    *,
    tokens: float | None,
    params: TimeParams,
) -> dict[str, float]:
    """estimate_time on the one-row grid of `row` (what the program stands for)."""
    from .._grid import DEFAULTS

    g = make_grid({k: v for k, v in row.items() if k in DEFAULTS})
    gpu: dict[str, Any] = dict(links)
    out = estimate_time(m, g, **gpu, tokens=tokens, params=params, reason=np.zeros(1, np.int8))
    return {k: float(v[0]) for k, v in out.items()}
