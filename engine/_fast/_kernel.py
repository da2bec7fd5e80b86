"""Which per-row assembly estimate() runs: numpy's (the reference, always there) or the compiled
loop of engine/_fast/_kernel_numba.py (numba, the `fast` extra), which fuses the per-row work
into one pass over all cores and returns the same bits.

`TRAINMEM_KERNEL` chooses: `auto` (default), `numpy` or `numba` (an error if numba is missing).
`auto` takes the compiled loop where numba imports and the work pays for loading it: importing
numba and loading the cached machine code take about 0.25 s once per process (about 6 s the
first time ever, to compile), while numpy assembles 1M rows in about 0.1-0.3 s. So: a grid of
at least KERNEL_MIN_ROWS rows, or of KERNEL_LOADED_MIN_ROWS once something has loaded the
kernel; a caller with many rows to come in chunks (an exhaustive sweep) loads it up front with
`preload(total_rows)`.
`TRAINMEM_THREADS` caps the loop's threads (default: numba's, one per core; joblib's workers
set NUMBA_NUM_THREADS to their share).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from .._peaks import STAGE_COLUMNS

KERNEL_ENV = "TRAINMEM_KERNEL"
KERNELS = ("auto", "numpy", "numba")
THREADS_ENV = "TRAINMEM_THREADS"
KERNEL_MIN_ROWS = 1 << 21
"""Rows from which `auto` loads the compiled loop for one call (2M rows: numpy takes about as
long as loading the kernel)."""
KERNEL_LOADED_MIN_ROWS = 1 << 13
"""Rows from which `auto` takes the compiled loop once it is loaded (below, numpy's few dozen
calls cost less than preparing the loop's arguments)."""
_loaded = False


def kernel_choice() -> str:
    """The TRAINMEM_KERNEL setting, checked."""
    choice = os.environ.get(KERNEL_ENV, "auto").strip().lower() or "auto"
    if choice not in KERNELS:
        raise ValueError(f"{KERNEL_ENV}: unknown {choice!r}; allowed: {' | '.join(KERNELS)}")
    return choice


_unavailable: list[str] = []
"""Why the compiled kernel did not load (empty: not tried, or loaded)."""


def engine_sources_digest() -> str:
    """A name for the engine's sources as they are: the start of the SHA-256 of every engine
    module (this folder's too). numba's cache=True checks only the timestamp of the file that
    defines a jitted function, so `assemble_rows` (engine/_fast/_kernel_numba.py) would reuse
    machine code that inlined older generated functions (engine/_fast/_rows.py: the rules, the
    peaks) after an upgrade or a checkout; one cache folder per version of the sources cannot."""
    h = hashlib.sha256()
    engine = Path(__file__).parent.parent
    for path in sorted(engine.rglob("*.py")):
        h.update(path.relative_to(engine).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


@functools.cache
def _compiled() -> ModuleType | None:
    """engine/_kernel_numba, or None where it does not load: numba missing, a numba that does
    not support this numpy, or nowhere to cache the machine code (numba refuses cache=True
    without a writable folder beside the module or in its user cache, NUMBA_CACHE_DIR)."""
    if not os.environ.get("NUMBA_CACHE_DIR", "").strip():
        # numba keeps machine code beside the module by default: inside site-packages, where
        # pip's uninstall leaves it behind (a later `pip install -e .` then finds a `trainmem`
        # folder without __init__.py), and there it is reused after the engine's sources
        # change. numba reads the setting at import: where something imported it already
        # (a caller, a test), its config is read again.
        from ._formula_kernels import cache_root

        os.environ["NUMBA_CACHE_DIR"] = str(cache_root() / "numba" / engine_sources_digest())
        if "numba" in sys.modules:
            sys.modules["numba"].core.config.reload_config()
    try:
        return importlib.import_module("._kernel_numba", __package__)
    except (ImportError, RuntimeError, OSError) as error:
        _unavailable.append(f"{type(error).__name__}: {error}".splitlines()[0])
        return None


def compiled_for(num_rows: int) -> ModuleType | None:
    """The compiled kernel's module where it should assemble `num_rows` rows, else None."""
    choice = kernel_choice()
    if choice == "numpy":
        return None
    if choice == "auto" and num_rows < (KERNEL_LOADED_MIN_ROWS if _loaded else KERNEL_MIN_ROWS):
        return None
    return _load(required=choice == "numba")


def preload(total_rows: int) -> bool:
    """Load the compiled kernel now where `auto` would take it for `total_rows` rows evaluated
    in smaller grids (the chunks of a sweep); True if it is loaded. Under TRAINMEM_KERNEL=numba
    this process also compiles from then on the formula kernels of the models it evaluates,
    however few keys a chunk has (formulas_for)."""
    if kernel_choice() == "numpy":
        return False
    global _compile_formulas
    _compile_formulas = _compile_formulas or kernel_choice() == "numba"
    if total_rows >= KERNEL_MIN_ROWS or kernel_choice() == "numba":
        return _load(required=kernel_choice() == "numba") is not None
    return _loaded


def _load(*, required: bool) -> ModuleType | None:
    global _loaded
    module = _compiled()
    if module is None and required:
        why = _unavailable[0] if _unavailable else "numba is not installed"
        raise ValueError(f"{KERNEL_ENV}: numba: the compiled kernel does not load ({why})")
    _loaded = module is not None
    return module


def _threads(module: ModuleType) -> None:
    """Cap the loop's threads at TRAINMEM_THREADS where set."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if not value:
        return
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{THREADS_ENV}: must be a whole number >= 1, got {value!r}")
    module.numba.set_num_threads(min(int(value), module.numba.config.NUMBA_NUM_THREADS))


GATHER_MIN_BYTES = 1 << 24
"""Per-key tables from this size (16 MiB, beyond the CPU's caches) are copied out block by
block before the compiled loop assembles the rows (_kernel_numba.assemble_rows): read in random
order (a grid of varied rows), the tight copy overlaps its cache misses, the long assembly loop
would not (bench.throughput's random rows: 0.58 -> 0.47 s per million on 2 threads). Smaller
tables (a sweep's: 10 MiB for a million sweep-shaped rows) are read in place, where the copy
costs more than it saves (0.20 -> 0.22 s)."""


def _keys_by_terms(table: np.ndarray) -> np.ndarray:
    """A per-key table (terms x keys) as keys x terms in C order (free for the large tables,
    which _estimate._key_tables stores that way already)."""
    return np.ascontiguousarray(table.T)


def assemble(
    module: ModuleType,
    variants: Sequence[Any],
    keys: tuple[np.ndarray, np.ndarray],
    stages: Sequence[np.ndarray],
    rows: dict[str, np.ndarray],
    consts: tuple[float, float, float, float],
    extra: tuple[Sequence[int], Sequence[int]] = ((), ()),
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(the columns of _kernel_numba.OUT_COLUMNS plus peak_phase, fits and pp_stage, the
    `extra` terms of the chosen stage variant) for every row, through the compiled loop.

    `variants`: _estimate._Tables of the first stage and, where some rows are pipelined, the
    last; `keys`: each row's state and activation key; `stages`: the variants' stage per row;
    `rows`: the STAGE_COLUMNS (engine/_peaks.py), num_micro, expandable, outside_torch, limit
    and reason per row;
    consts: cuBLAS workspace, fragmentation fractions (native, expandable segments),
    largest-block factor; `extra`: (state, activation) term indices (rows of the tables) to
    return too, in that order.
    """
    _threads(module)
    n = len(keys[0])
    first, last = variants[0], variants[-1]
    tables = (first.state, first.activation, last.state, last.activation)
    ints = functools.partial(np.ascontiguousarray, dtype=np.int64)
    floats = functools.partial(np.ascontiguousarray, dtype=np.float64)
    extra_terms = (ints(extra[0]), ints(extra[1]))
    outs = (
        np.empty((module.NUM_OUT, n)),
        np.empty((len(extra_terms[0]) + len(extra_terms[1]), n)),
    )
    # One int8 array for the int8 and bool columns: in numba 0.68 a tuple of output arrays of
    # mixed dtypes came back scrambled from the parallel loop (seen here; floats-only is fine).
    flags = np.empty((3, n), dtype=np.int8)
    by_keys = tuple(_keys_by_terms(t) for t in tables)
    module.assemble_rows(
        by_keys,
        (ints(keys[0]), ints(keys[1])),
        (ints(stages[0]), ints(stages[-1])),
        len(variants) > 1,
        max(t.nbytes for t in by_keys) >= GATHER_MIN_BYTES,
        tuple(ints(rows[k]) for k in STAGE_COLUMNS),
        tuple(
            floats(rows[k]) for k in ("num_micro", "expandable", "outside_torch", "limit", "reason")
        ),
        floats(consts),
        extra_terms,
        outs,
        flags,
    )
    (out, extra_out), (phase, variant, fits) = outs, flags
    columns = dict(zip(module.OUT_COLUMNS, out, strict=True))
    stage = stages[0] if len(stages) == 1 else np.where(variant == 1, stages[1], stages[0])
    columns.update(peak_phase=phase, fits=fits.view(bool), pp_stage=stage)
    return columns, extra_out


def layout_reason(module: ModuleType, m: Any, g: dict[str, np.ndarray]) -> np.ndarray:
    """_estimate.layout_reason of a model without a traced profile, through the compiled loop
    generated from engine/_rules.RULES (the grid's columns as they are: make_grid's dtypes,
    broadcast columns not copied)."""
    _threads(module)
    from .._rules import RuleModel
    from . import _rows  # it imports _estimate, which imports this module

    rows = _rows.numba_module()
    reason = np.empty(len(g["tp"]), dtype=np.int8)
    columns = zip(rows.REASON_COLUMNS, rows.REASON_DTYPES, strict=True)
    rows.reason_rows(
        *(_read_only(g[k], np.dtype(dt)) for k, dt in columns), *RuleModel.of(m), reason
    )
    return reason


def _read_only(column: Any, dtype: Any) -> np.ndarray:
    """A read-only view of a column in `dtype` (a copy only where the dtype differs)."""
    view = np.asarray(column, dtype=dtype).view()
    view.flags.writeable = False
    return view


FORMULA_MIN_KEYS = 1 << 14
"""Keys from which a model's formula kernel is loaded (or compiled) for a grid, whatever the
choice (below, numpy's formulas take about 10 ms or less)."""
FORMULA_LOADED_MIN_KEYS = 64
"""Keys from which a model's formula kernel, once loaded in this process, is used (its call
costs tens of microseconds; numpy's formulas about a millisecond at any size this small)."""
FORMULA_CHECK_KEYS = 64
"""Keys on which a kernel is checked against numpy's formulas the first time a process uses it."""
_compile_formulas = False
_formulas: dict[tuple, Any] = {}
formula_fallbacks: list[str] = []
"""Why a model's formulas stayed numpy's (untraceable, no scalar form, a check that failed)."""


def formulas_for(m: Any, fn: Any, columns: dict[str, np.ndarray], num_keys: int) -> Any | None:
    """fn(m, columns)'s per-key terms as a compiled loop (engine/_fast/_formula_kernels.py: its
    `table(columns, names)` gives keys x names), or None where numpy's formulas should run.

    With numba loaded (TRAINMEM_KERNEL=numba, or under `auto` a grid or sweep large enough for
    the compiled loop) a model's kernel compiled before (by any process) is used for any grid of
    FORMULA_LOADED_MIN_KEYS keys or more: a sweep's chunks too. Only TRAINMEM_KERNEL=numba
    compiles a new one (20-45 s per model, then cached on disk; `auto` never pays that): for a
    grid of FORMULA_MIN_KEYS keys, or for any grid after preload() of a sweep.
    None also where the formulas do not trace or a kernel disagrees with numpy on its first
    keys (formula_fallbacks says why)."""
    choice = kernel_choice()
    if choice == "numpy" or num_keys < FORMULA_LOADED_MIN_KEYS:
        return None
    if not _loaded and (choice == "auto" or num_keys < FORMULA_MIN_KEYS):
        return None  # numba stays unimported where the rows don't pay
    if _load(required=choice == "numba") is None:
        return None
    dtypes = tuple((k, v.dtype.str) for k, v in columns.items())
    try:
        key: tuple = (m, fn.__qualname__, dtypes)
        hash(key)
    except TypeError:  # a model that does not hash: traced anew each call
        key = (id(m), fn.__qualname__, dtypes, object())
    if key not in _formulas:
        _formulas[key] = _prepare(m, fn, dict(dtypes))
    ready = _formulas[key]
    if ready is None:
        return None
    usable = (
        ready.kernel is not None  # loaded in this process
        or ready.compiled()  # machine code on disk
        or (choice == "numba" and (_compile_formulas or num_keys >= FORMULA_MIN_KEYS))
    )
    return ready if usable and ready.checked(columns) else None


class _Formulas:
    """A model's generated formula kernel: compiled and checked on first use."""

    def __init__(self, m: Any, fn: Any, text: str, outputs: tuple[str, ...]) -> None:
        self.m, self.fn, self.text, self.outputs = m, fn, text, outputs
        self.kernel: Any = None
        self._compiled = False

    def compiled(self) -> bool:
        """Whether its machine code is on disk already (a previous run compiled and checked it)."""
        if not self._compiled:
            from . import _formula_kernels

            self._compiled = _formula_kernels.checked_marker(self.text).is_file()
        return self._compiled

    def run(self, columns: dict[str, np.ndarray]) -> np.ndarray:
        """Every output of every key: keys x outputs (self.outputs' order), C order."""
        n = len(next(iter(columns.values())))
        out = np.empty((n, len(self.outputs)))
        self.kernel(*(np.ascontiguousarray(v) for v in columns.values()), out)
        return out

    def table(self, columns: dict[str, np.ndarray], names: Sequence[str]) -> np.ndarray:
        """The outputs `names` of every key: keys x names, C order."""
        out = self.run(columns)
        return out[:, [self.outputs.index(k) for k in names]]

    def checked(self, columns: dict[str, np.ndarray]) -> bool:
        """Whether the kernel is ready: (once per process) loaded and its first keys checked
        against numpy's formulas; False (and a fallback reason) where they differ."""
        if self.kernel is not None:
            return True
        from . import _formula_kernels

        try:
            self.kernel = _formula_kernels.load(self.text)
        except OSError as error:
            self._give_up(f"{type(error).__name__}: {error}")
            return False
        sample = {k: v[:FORMULA_CHECK_KEYS] for k, v in columns.items()}
        try:  # the first call compiles the kernel, or loads its machine code
            mine = dict(zip(self.outputs, self.run(sample).T, strict=True))
        except Exception as error:  # numba's errors have no common base; numpy's stays
            self._give_up(f"{type(error).__name__}: {error}".splitlines()[0])
            return False
        theirs = self.fn(self.m, sample)
        n = len(next(iter(sample.values())))
        for k in self.outputs:
            expected = np.broadcast_to(np.asarray(theirs[k], dtype=np.float64), (n,))
            if not np.array_equal(mine[k], expected, equal_nan=True):
                self._give_up(f"{k} differs from numpy's")
                return False
        _formula_kernels.checked_marker(self.text).touch()
        self._compiled = True
        return True

    def _give_up(self, why: str) -> None:
        """numpy's formulas for this model from now on, and why."""
        formula_fallbacks.append(f"{self.fn.__qualname__} ({self.m.name}): {why}")
        self.kernel = None
        _formulas.update({key: None for key, v in _formulas.items() if v is self})


def _prepare(m: Any, fn: Any, dtypes: dict[str, str]) -> _Formulas | None:
    """Trace `fn` for model `m` and generate its kernel's source (not compiled yet)."""
    from . import _formula_kernels, _formula_trace

    try:
        program = _formula_trace.trace(fn, m, {k: np.dtype(v) for k, v in dtypes.items()})
        outputs = tuple(program.outputs)
        text = _formula_kernels.source(program, outputs)
    except (_formula_trace.Untraceable, _formula_kernels.CodegenError) as error:
        formula_fallbacks.append(f"{fn.__qualname__}: {error}")
        return None
    return _Formulas(m, fn, text, outputs)
