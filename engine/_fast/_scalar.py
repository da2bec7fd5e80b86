"""estimate_one(): one configuration in microseconds, for callers that ask one at a time (the
HTTP service, the Python API in a user's loop, advice neighbours, Optuna trials).

estimate() on a grid of one row costs about 2 ms: thousands of numpy calls on arrays of one
element. Here the row stays Python scalars. What depends on the layout only (model states) and
on the micro-batch shape only (activations) comes from per-model caches of the engine's own
per-key terms (_estimate._key_tables, evaluated on a one-row grid the first time a key is seen),
and the layout rules, peaks and slack run as the plain-Python programs generated from the
engine's own definitions (engine/_fast/_rows.py python_module). The result is
the same, to the bit, as estimate() on that row (tests/unit/engine/test_scalar.py).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

import numpy as np

from .._codes import EXPANDABLE_SEGMENTS
from .._estimate import (
    _A_TERMS,
    _OPTIONAL_TERMS,
    _S_TERMS,
    OUTPUTS,
    _key_tables,
    batch_layout,
    layout_reason,
)
from .._grid import BOOL_FIELDS, CATEGORICAL, DEFAULTS, FLOAT_FIELDS, make_grid
from .._load import cached_load_reserve_bytes
from .._lora import lora_mask, lora_zero3
from .._model import ModelSpec
from .._overhead import Overheads
from .._peaks import STAGE_COLUMNS, STAGE_PEAKS
from .._pipeline import STAGE_FIRST, STAGE_LAST, STAGE_MIDDLE, STAGE_ONLY
from .._rank_activations import ACT_KEYS
from .._rank_states import STATE_KEYS
from .._rules import RuleModel
from .._tensor_parallel import sequence_parallel_on
from . import _rows

_TERMS = (
    [*_S_TERMS, *(t for s, _ in _OPTIONAL_TERMS.values() for t in s)],
    [*_A_TERMS, *(t for _, a in _OPTIONAL_TERMS.values() for t in a)],
)
"""Every per-key term, state and activation (the optional ones too): a cached key has them all."""
_S_INDEX = {k: i for i, k in enumerate(_TERMS[0])}
_ALLOCATED = STAGE_PEAKS.index("peak_allocated_bytes")
_GRADS_AT_PEAK = STAGE_PEAKS.index("gradients")
_A_INDEX = {k: i for i, k in enumerate(_TERMS[1])}
_CODES = {field: {name: i for i, name in enumerate(vocab)} for field, vocab in CATEGORICAL.items()}


@functools.cache
def _row_defaults() -> dict[str, Any]:
    """Every grid field's default as a Python scalar (categoricals as codes)."""
    return {k: column[0].item() for k, column in make_grid().items()}


_BOOLS, _FLOATS = frozenset(BOOL_FIELDS), frozenset(FLOAT_FIELDS)
_STATE_KEY, _ACT_KEY = operator.itemgetter(*STATE_KEYS), operator.itemgetter(*ACT_KEYS)
"""A row's model-state and activation keys (tuples of its values, in the engine's key order)."""
_OUTPUTS_OF = operator.itemgetter(*OUTPUTS)
_STAGE_COLUMNS = (
    operator.itemgetter(*STAGE_COLUMNS)
    if len(STAGE_COLUMNS) > 1
    else lambda row: (row[STAGE_COLUMNS[0]],)
)
"""A row's STAGE_COLUMNS, as a tuple (the generated stage_peaks' `layout`)."""
_CACHE_LIMIT = 200_000
"""Keys cached per model before its caches start over (about 100 MB at the limit)."""


class _ModelCache(NamedTuple):
    model: ModelSpec
    constants: tuple[int, ...]
    """The model's numbers the layout rules read (engine/_rules.RuleModel)."""
    states: dict[tuple, tuple[float, ...]]
    activations: dict[tuple, tuple[float, ...]]


_caches: dict[int, _ModelCache] = {}


def _cache_of(m: ModelSpec) -> _ModelCache:
    """The term caches of model `m` (by identity: a ModelSpec is immutable)."""
    cache = _caches.get(id(m))
    if cache is None or cache.model is not m:
        if len(_caches) >= 64:
            _caches.clear()
        cache = _caches[id(m)] = _ModelCache(m, tuple(RuleModel.of(m)), {}, {})
    return cache


def encode_row(config: Mapping[str, Any]) -> dict[str, Any]:
    """A configuration (grid field names; categoricals as names or codes) as the scalar row
    make_grid would make of it: every field, Python ints / floats / bools, categorical codes.
    Errors as make_grid's."""
    row = dict(_row_defaults())
    for name, value in config.items():
        if name not in row:
            raise ValueError(f"unknown grid field(s): {name}; allowed: {', '.join(DEFAULTS)}")
        if name in _CODES:
            codes = _CODES[name]
            if isinstance(value, str):
                if value not in codes:
                    raise ValueError(
                        f"{name}: unknown value '{value}'; allowed: {', '.join(codes)}"
                    )
                value = codes[value]
            elif not 0 <= int(value) < len(codes):
                raise ValueError(f"{name}: code out of range; allowed: {', '.join(codes)}")
            row[name] = int(value)
        elif name in _BOOLS:
            row[name] = bool(value)
        elif name in _FLOATS:
            value = float(value)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: must be finite numbers >= 0")
            row[name] = value
        elif name == "lora_targets":
            row[name] = lora_mask(value) if isinstance(value, str) else int(value)
        else:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(f"{name}: must be whole numbers")
            row[name] = int(value)
    return row


def _stage_pos(stage: int, pp: int) -> int:
    """_pipeline.stage_position of one row."""
    if pp <= 1:
        return STAGE_ONLY
    return STAGE_FIRST if stage <= 0 else (STAGE_LAST if stage >= pp - 1 else STAGE_MIDDLE)


def _terms(
    m: ModelSpec, cache: _ModelCache, row: dict[str, Any], stage_pos: int
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(state terms, activation terms) of the row on a stage: cached, or evaluated by the
    engine's per-key pass on a one-row grid and cached."""
    row["stage_pos"] = stage_pos
    s_key, a_key = _STATE_KEY(row), _ACT_KEY(row)
    s, a = cache.states.get(s_key), cache.activations.get(a_key)
    if s is None or a is None:
        s, a = _evaluate_terms(m, row, stage_pos)
        if len(cache.states) >= _CACHE_LIMIT or len(cache.activations) >= _CACHE_LIMIT:
            cache.states.clear()
            cache.activations.clear()
        cache.states[s_key], cache.activations[a_key] = s, a
    return s, a


def _evaluate_terms(
    m: ModelSpec, row: dict[str, Any], stage_pos: int
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Every per-key term of the row, as estimate()'s per-key pass computes them."""
    g = make_grid({k: v for k, v in row.items() if k in DEFAULTS})
    dp, _, _ = batch_layout(g)
    sp = sequence_parallel_on(g["sequence_parallel"], g["tp"], g["framework"])
    cols = {**g, "dp": dp, "sp": sp}
    cols["lora_zero3"] = lora_zero3(g["zero"], g["lora_rank"])
    cols["stage_pos"] = np.full(1, stage_pos, dtype=np.int8)
    _, _, (tables,) = _key_tables(m, cols, [None], _TERMS)
    return tuple(tables.state[:, 0].tolist()), tuple(tables.activation[:, 0].tolist())


def estimate_one(
    m: ModelSpec,
    config: Mapping[str, Any] | None = None,
    *,
    usable_bytes: float = math.inf,
    headroom: float = 0.10,
    overheads: Overheads | None = None,
    pp_stage: int | None = None,
    columns: Collection[str] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """estimate() of one configuration (grid fields by name, in `config` or as keywords), as
    Python scalars: the same keys (OUTPUTS, or `columns`) and values as
    `estimate(m, make_grid(config), ...)` has in its one row."""
    row = encode_row({**(config or {}), **fields})
    ov = overheads or Overheads()
    cache = _cache_of(m)
    tp, pp, cp = row["tp"], row["pp"], row["cp"]
    dp = max(row["num_gpus"] // max(tp * pp * cp, 1), 1)
    micro, given = row["micro_batch_size"], row["global_batch_size"]
    num_micro = float(max(given // max(micro * dp, 1) if given > 0 else 1, 1))
    row["dp"] = dp
    row["sp"] = bool(sequence_parallel_on(row["sequence_parallel"], tp, row["framework"]))
    row["lora_zero3"] = bool(lora_zero3(row["zero"], row["lora_rank"]))
    reason = _reason(m, cache, row)
    peaks, s, a, stage = _worst_rank(m, cache, row, pp_stage, num_micro)
    allocated = peaks[_ALLOCATED]
    expandable = row["allocator"] == EXPANDABLE_SEGMENTS
    (fragmentation,) = _rows.python_module().fragmentation(
        s, a, allocated, peaks[_GRADS_AT_PEAK], expandable, _consts(ov)
    )
    communicators = float((dp > 1) + (tp > 1) + (pp > 1) + (cp > 1))
    outside_torch = ov.cuda_context_bytes + ov.nccl_bytes_per_communicator * communicators
    reserved = allocated + ov.cublas_workspace_bytes + fragmentation
    device = reserved + outside_torch
    limit = usable_bytes * (1.0 - headroom)
    load_device, load_host = _load(m, cache, row, pp_stage, s, outside_torch)
    kept = float(cached_load_reserve_bytes(load_device, device))
    fragmentation, reserved, device = fragmentation + kept, reserved + kept, device + kept
    out: dict[str, Any] = dict(zip(STAGE_PEAKS, peaks, strict=True))
    out.update(
        peak_phase=int(out["peak_phase"]),
        framework_overhead=outside_torch + ov.cublas_workspace_bytes,
        fragmentation=fragmentation,
        peak_reserved_bytes=reserved,
        peak_device_bytes=device,
        pp_stage=stage,
        dp=dp,
        num_microbatches=num_micro,
        fits=bool(device <= limit and reason == 0 and load_device <= limit),
        headroom_bytes=min(limit - device, limit - load_device),
        reason=reason,
        peak_load_bytes=load_device,
        load_host_bytes=load_host,
    )
    out.update(_terms_out(s, a, out["in_flight"], num_micro))
    if columns is None:
        return dict(zip(OUTPUTS, _OUTPUTS_OF(out), strict=True))
    return {k: out[k] for k in OUTPUTS if k in columns}


def _worst_rank(
    m: ModelSpec, cache: _ModelCache, row: dict[str, Any], pp_stage: int | None, num_micro: float
) -> tuple[tuple, tuple[float, ...], tuple[float, ...], int]:
    """(the STAGE_PEAKS, state terms, activation terms, stage) of the row's worst rank:
    the first stage's, or the last's where its allocated peak is larger; or stage `pp_stage`."""
    pp, layout = row["pp"], _STAGE_COLUMNS(row)
    stage = 0 if pp_stage is None else min(pp_stage, pp - 1)
    s, a = _terms(m, cache, row, _stage_pos(stage, pp))
    stage_peaks = _rows.python_module().stage_peaks
    peaks = stage_peaks(s, a, layout, stage, num_micro)
    if pp_stage is None and pp > 1:
        s_last, a_last = _terms(m, cache, row, STAGE_LAST)
        last = stage_peaks(s_last, a_last, layout, pp - 1, num_micro)
        if last[_ALLOCATED] > peaks[_ALLOCATED]:
            return last, s_last, a_last, pp - 1
    return peaks, s, a, stage


def _consts(ov: Overheads) -> tuple[float, float, float, float]:
    """The overheads the fragmentation function reads, in its order (_rows.FRAGMENTATION_CONSTS)."""
    return (
        ov.cublas_workspace_bytes,
        ov.fragmentation_fraction,
        ov.expandable_segments_fragmentation_fraction,
        ov.fragmentation_largest_block_factor,
    )


def _load(
    m: ModelSpec,
    cache: _ModelCache,
    row: dict[str, Any],
    pp_stage: int | None,
    s: tuple,
    outside_torch: float,
) -> tuple[float, float]:
    """(device bytes, host bytes) at the load phase's peak (estimate's _with_load): the worse
    of the first and last stages, or stage `pp_stage`'s (whose terms are `s`), with the bytes
    outside torch (`outside_torch`)."""
    peak, host = s[_S_INDEX["load_peak"]], s[_S_INDEX["load_host_bytes"]]
    if pp_stage is not None:
        return peak + outside_torch, host
    pp = row["pp"]
    for pos in (_stage_pos(0, pp), _stage_pos(pp - 1, pp)):
        t, _ = _terms(m, cache, row, pos)
        peak = max(peak, t[_S_INDEX["load_peak"]])
        host = max(host, t[_S_INDEX["load_host_bytes"]])
    return peak + outside_torch, host


def _terms_out(
    s: tuple[float, ...], a: tuple[float, ...], in_flight: float, num_micro: float
) -> dict[str, float]:
    """The output columns that are per-key terms of the worst rank's stage (host_bytes:
    _estimate.host_bytes_of)."""
    host_accum = s[_S_INDEX["host_accum_bytes"]] if num_micro > 1 else 0.0
    return {
        "parameters": s[_S_INDEX["parameters"]],
        "master_weights": s[_S_INDEX["master_weights"]],
        "optimizer_states": s[_S_INDEX["optimizer_states"]],
        "activations_autocast_weight_copies": a[_A_INDEX["activations_autocast_weight_copies"]],
        "optimizer_step_temporaries": s[_S_INDEX["optimizer_step_temporaries"]],
        "paged_optimizer_bytes": s[_S_INDEX["paged_optimizer_bytes"]],
        "activations_per_layer": a[_A_INDEX["activations_per_layer"]],
        "activations_outside_layers": a[_A_INDEX["activations_outside_layers"]],
        "host_bytes": s[_S_INDEX["host_bytes"]]
        + host_accum
        + in_flight * a[_A_INDEX["activations_offloaded"]],
    }


def layout_reason_one(m: ModelSpec, row: Mapping[str, Any]) -> int:
    """layout_reason of one row (`row`: encode_row's values), as a Python int."""
    return _reason(m, _cache_of(m), row)


def _reason(m: ModelSpec, cache: _ModelCache, row: Mapping[str, Any]) -> int:
    """layout_reason of the row: the scalar rules, or the engine's where a traced profile adds
    its own."""
    if m.profile is not None:
        g = make_grid({k: v for k, v in row.items() if k in DEFAULTS})
        return int(layout_reason(m, g)[0])
    rows = _rows.python_module()
    (code,) = rows.reason(*_reason_args(rows.REASON_COLUMNS)(row), *cache.constants)
    return int(code)


@functools.cache
def _reason_args(columns: tuple[str, ...]) -> Any:
    """A row's values the generated rules read, in their order."""
    return operator.itemgetter(*columns)
