"""Trace a per-key formula function (state_terms, activation_terms) into a straight-line program.

The engine's formulas are numpy over columns: arithmetic, comparisons, np.where / np.select,
lookups of small per-code tables (PRECISIONS x ...) and casts; what depends on the model only is
Python (`if m.is_moe`, constants). Called once with a `Sym` per column instead of an array,
every numpy operation on a row's values is recorded as a node (its ufunc, operands and the
dtype numpy gives it); the model's Python runs as usual, so the program is the formulas of
one model. engine/_fast/_formula_kernels.py turns it into one compiled loop over keys.

What cannot be traced raises `Untraceable` (a value inspected in Python: `bool()`, `len()`,
`float()`, an unsupported numpy function), and the caller keeps numpy's formulas: the program
never guesses. numpy's functions remain the reference; the compiled loop returns their bits
(tests/unit/engine/test_formula_kernels.py).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np


class Untraceable(Exception):
    """A formula does something the tracer does not record."""


class Node(NamedTuple):
    """One operation: `op` a ufunc's name or col / const / cast / lookup / where."""

    op: str
    args: tuple[Any, ...]
    dtype: np.dtype


class Graph:
    """The recorded operations, each once (a repeated operation on the same operands is the
    same node)."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self._seen: dict[tuple, int] = {}

    def add(self, op: str, args: tuple[Any, ...], dtype: Any) -> Sym:
        dt = np.dtype(dtype)
        key = (op, tuple(_operand_key(a) for a in args), dt.str)
        if key not in self._seen:
            self.nodes.append(Node(op, args, dt))
            self._seen[key] = len(self.nodes) - 1
        return Sym(self, self._seen[key], dt)


def _operand_key(a: Any) -> Any:
    if isinstance(a, Sym):
        return ("node", a.id)
    return ("const", type(a).__name__, repr(a))


def _strong(a: Any) -> Any:
    """A one-element array operand as a numpy scalar of its dtype (strongly typed, as numpy
    treats it); other operands as they are."""
    if isinstance(a, np.ndarray):
        if a.size != 1:
            raise Untraceable(f"an array operand of shape {a.shape}")
        return a.dtype.type(a.reshape(()).item())
    return a


def _sample(a: Any) -> Any:
    """What numpy's dtype rules see of an operand: a one-element array for a traced value."""
    return np.ones(1, dtype=a.dtype) if isinstance(a, Sym) else a


def result_dtype(fn: Callable[..., Any], args: tuple[Any, ...]) -> np.dtype:
    """The dtype numpy gives `fn(*args)` (computed on one-element samples)."""
    with np.errstate(all="ignore"):
        return np.asarray(fn(*(_sample(a) for a in args))).dtype


class Sym:
    """A traced column value (one key's)."""

    __array_priority__ = 1000
    ndim = 1
    shape = (1,)

    def __init__(self, graph: Graph, index: int, dtype: np.dtype) -> None:
        self.g, self.id, self.dtype = graph, index, dtype

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kw: Any) -> Any:
        if method != "__call__" or kw:
            raise Untraceable(f"{ufunc.__name__}.{method} with {sorted(kw)}")
        if ufunc.nout != 1:
            raise Untraceable(f"{ufunc.__name__} has {ufunc.nout} outputs")
        args = tuple(_strong(a) for a in inputs)
        return self.g.add(ufunc.__name__, args, result_dtype(ufunc, args))

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        handler = _FUNCTIONS.get(func)
        if handler is None:
            raise Untraceable(f"numpy.{func.__name__}")
        return handler(*args, **kwargs)

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise Untraceable("a traced value converted to an array")

    def __bool__(self) -> bool:
        raise Untraceable("a traced value's truth tested in Python")

    def __len__(self) -> int:
        raise Untraceable("len() of a traced value")

    def __getitem__(self, index: Any) -> Any:
        raise Untraceable(f"a traced value indexed with {index!r}")

    def astype(self, dtype: Any, copy: bool = True) -> Sym:
        dt = np.dtype(dtype)
        return self if dt == self.dtype else self.g.add("cast", (self,), dt)

    def copy(self) -> Sym:
        return self

    def __hash__(self) -> int:
        return hash((id(self.g), self.id))

    # Operators: the ufuncs numpy's arrays map them to.
    def __add__(self, o: Any) -> Any:
        return np.add(self, o)

    def __radd__(self, o: Any) -> Any:
        return np.add(o, self)

    def __sub__(self, o: Any) -> Any:
        return np.subtract(self, o)

    def __rsub__(self, o: Any) -> Any:
        return np.subtract(o, self)

    def __mul__(self, o: Any) -> Any:
        return np.multiply(self, o)

    def __rmul__(self, o: Any) -> Any:
        return np.multiply(o, self)

    def __truediv__(self, o: Any) -> Any:
        return np.true_divide(self, o)

    def __rtruediv__(self, o: Any) -> Any:
        return np.true_divide(o, self)

    def __floordiv__(self, o: Any) -> Any:
        return np.floor_divide(self, o)

    def __rfloordiv__(self, o: Any) -> Any:
        return np.floor_divide(o, self)

    def __mod__(self, o: Any) -> Any:
        return np.remainder(self, o)

    def __rmod__(self, o: Any) -> Any:
        return np.remainder(o, self)

    def __pow__(self, o: Any) -> Any:
        return np.power(self, o)

    def __rpow__(self, o: Any) -> Any:
        return np.power(o, self)

    def __and__(self, o: Any) -> Any:
        return np.bitwise_and(self, o)

    def __rand__(self, o: Any) -> Any:
        return np.bitwise_and(o, self)

    def __or__(self, o: Any) -> Any:
        return np.bitwise_or(self, o)

    def __ror__(self, o: Any) -> Any:
        return np.bitwise_or(o, self)

    def __xor__(self, o: Any) -> Any:
        return np.bitwise_xor(self, o)

    def __rxor__(self, o: Any) -> Any:
        return np.bitwise_xor(o, self)

    def __lt__(self, o: Any) -> Any:
        return np.less(self, o)

    def __le__(self, o: Any) -> Any:
        return np.less_equal(self, o)

    def __gt__(self, o: Any) -> Any:
        return np.greater(self, o)

    def __ge__(self, o: Any) -> Any:
        return np.greater_equal(self, o)

    def __eq__(self, o: Any) -> Any:  # type: ignore[override]
        return np.equal(self, o)

    def __ne__(self, o: Any) -> Any:  # type: ignore[override]
        return np.not_equal(self, o)

    def __neg__(self) -> Any:
        return np.negative(self)

    def __pos__(self) -> Sym:
        return self

    def __invert__(self) -> Any:
        return np.invert(self)

    def __abs__(self) -> Any:
        return np.absolute(self)


class Stack(list):
    """np.stack of traced values: only reduced over its first axis (np.max(..., axis=0))."""

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        handler = _FUNCTIONS.get(func)
        if handler is None:
            raise Untraceable(f"numpy.{func.__name__} of a stack")
        return handler(*args, **kwargs)


def _where(condition: Any, a: Any = None, b: Any = None) -> Any:
    if a is None or b is None:
        raise Untraceable("np.where with one argument")
    args = tuple(_strong(x) for x in (condition, a, b))
    dt = result_dtype(np.where, args)
    graph = next(x.g for x in args if isinstance(x, Sym))
    if not isinstance(args[0], Sym):  # a condition fixed by the model: one branch
        chosen = args[1] if bool(args[0]) else args[2]
        return _as(graph, chosen, dt)
    return graph.add("where", args, dt)


def _as(graph: Graph, value: Any, dtype: np.dtype) -> Sym:
    """`value` (traced or a constant) as a traced value of `dtype`."""
    if isinstance(value, Sym):
        return value.astype(dtype)
    return graph.add("const", (np.asarray(value, dtype=dtype).item(),), dtype)


def _select(conditions: Any, choices: Any, default: Any = 0) -> Any:
    """np.select: the first true condition's choice (nested wheres, last to first)."""
    conditions, choices = list(conditions), list(choices)
    dt = np.result_type(*(_sample(_strong(x)) for x in [*choices, default]))
    out = default
    for condition, choice in reversed(list(zip(conditions, choices, strict=True))):
        out = _where(condition, choice, out)
    graph = next(x.g for x in [*conditions, *choices] if isinstance(x, Sym))
    return _as(graph, out, dt)


def _reduce(ufunc: np.ufunc) -> Callable[..., Any]:
    def reduce(a: Any, axis: Any = None, **kwargs: Any) -> Any:
        if not isinstance(a, Stack) or axis != 0 or kwargs:
            raise Untraceable(f"{ufunc.__name__}.reduce other than over a stack's first axis")
        out = a[0]
        for x in a[1:]:  # numpy's axis-0 reduction: row after row
            out = ufunc(out, x)
        return out

    return reduce


def _stack(arrays: Any, axis: int = 0, **kwargs: Any) -> Stack:
    if axis != 0 or kwargs:
        raise Untraceable("np.stack other than on a new first axis")
    return Stack(arrays)


def _filled(value: int) -> Callable[..., Sym]:
    def filled(a: Sym, dtype: Any = None, **kwargs: Any) -> Sym:
        return a.g.add("const", (value,), a.dtype if dtype is None else dtype)

    return filled


def _full_like(a: Sym, fill_value: Any, dtype: Any = None, **kwargs: Any) -> Sym:
    if isinstance(fill_value, Sym):
        return fill_value.astype(a.dtype if dtype is None else dtype)
    return _as(a.g, _strong(fill_value), np.dtype(a.dtype if dtype is None else dtype))


def _any(a: Any, *args: Any, **kwargs: Any) -> bool:
    """np.any of a traced value: True. The engine tests a mask only to skip work whose np.where
    gives the same values where the mask is false (`if not np.any(fp8): return zeros`), so the
    program keeps the general branch, right for every row."""
    return True


def _clip(a: Any, a_min: Any, a_max: Any, **kwargs: Any) -> Any:
    """np.clip as numpy's loop computes it: every operand in clip's dtype, then
    max(a, a_min) as `a if (isnan(a) or a > a_min) else a_min` and min(that, a_max) as
    `x if (isnan(x) or x < a_max) else a_max` (numpy's clip.cpp: a tie of signed zeros gives
    the bound, where np.maximum would give `a`)."""
    if kwargs:
        raise Untraceable(f"np.clip with {sorted(kwargs)}")
    args = tuple(_strong(x) for x in (a, a_min, a_max))
    dt = result_dtype(np.clip, args)
    graph = next(x.g for x in args if isinstance(x, Sym))
    x, low, high = (_as(graph, v, dt) for v in args)
    x = _where(np.not_equal(x, x) | np.greater(x, low), x, low)
    return _where(np.not_equal(x, x) | np.less(x, high), x, high)


_FUNCTIONS: dict[Any, Callable[..., Any]] = {
    np.clip: _clip,
    np.any: _any,
    np.where: _where,
    np.select: _select,
    np.stack: _stack,
    np.max: _reduce(np.maximum),
    np.amax: _reduce(np.maximum),
    np.min: _reduce(np.minimum),
    np.amin: _reduce(np.minimum),
    np.sum: _reduce(np.add),
    np.zeros_like: _filled(0),
    np.ones_like: _filled(1),
    np.full_like: _full_like,
    np.broadcast_to: lambda a, shape, subok=False: a,
    np.shape: lambda a: (1,),
}


class _Table(np.ndarray):
    """A module's per-code table while tracing: indexed by a traced code, a lookup node."""

    def __getitem__(self, index: Any) -> Any:
        base = self.view(np.ndarray)
        if isinstance(index, Sym):
            return index.g.add("lookup", (index, tuple(base.tolist())), base.dtype)
        return base[index]


_ASARRAY, _ARRAY = np.asarray, np.array


def _asarray(a: Any, dtype: Any = None, *args: Any, **kwargs: Any) -> Any:
    if isinstance(a, Sym):
        return a if dtype is None else a.astype(dtype)
    return _ASARRAY(a, dtype, *args, **kwargs)


def _array(a: Any, dtype: Any = None, *args: Any, **kwargs: Any) -> Any:
    if isinstance(a, Sym):
        return a if dtype is None else a.astype(dtype)
    return _ARRAY(a, dtype, *args, **kwargs)


_LOCK = threading.Lock()
_ENGINE = (__package__ or "trainmem.engine._fast").rpartition(".")[0]
"""The engine's package: its modules' per-code tables are patched while tracing."""


@contextlib.contextmanager
def _tracing(package: str) -> Iterator[None]:
    """While tracing: np.asarray / np.array take traced values (they are not dispatched to
    __array_function__), and the package's module-level 1-D numeric arrays (the per-code
    tables) index by a traced code. Both act as before on arrays; restored after."""
    with _LOCK:
        patched: list[tuple[Any, str, np.ndarray]] = []
        setattr(np, "asarray", _asarray)  # noqa: B010 (the module attribute itself)
        setattr(np, "array", _array)  # noqa: B010
        try:
            for name, module in list(sys.modules.items()):
                if module is None or not name.startswith(package):
                    continue
                for key, value in list(vars(module).items()):
                    if type(value) is np.ndarray and value.ndim == 1 and value.dtype.kind in "biuf":
                        patched.append((module, key, value))
                        setattr(module, key, value.view(_Table))
            yield
        finally:
            setattr(np, "asarray", _ASARRAY)  # noqa: B010
            setattr(np, "array", _ARRAY)  # noqa: B010
            for module, key, value in patched:
                setattr(module, key, value)


class Program(NamedTuple):
    """A traced function: its nodes, input columns (name, dtype) and outputs (name -> a traced
    value or a constant)."""

    nodes: list[Node]
    columns: tuple[tuple[str, str], ...]
    outputs: dict[str, Any]


def trace(fn: Callable[..., dict[str, Any]], m: Any, columns: dict[str, np.dtype]) -> Program:
    """Run `fn(m, c)` on traced columns of `columns`' dtypes; raises Untraceable."""
    graph = Graph()
    c = {k: graph.add("col", (k,), dt) for k, dt in columns.items()}
    with _tracing(_ENGINE), np.errstate(all="ignore"):
        try:
            out = fn(m, c)
        except Untraceable:
            raise
        except (TypeError, ValueError, IndexError, AttributeError) as error:
            raise Untraceable(f"{type(error).__name__}: {error}") from error
    cols = tuple((k, np.dtype(dt).str) for k, dt in columns.items())
    return Program(graph.nodes, cols, dict(out))
