"""estimate(): columns in, columns out. Phase-aware peak assembly per rank.

One code path: a single configuration is a grid of one row. No Python loop over rows: model
states and activation terms are evaluated on the distinct combinations of the columns they depend
on (see _factorize.py), the peaks are assembled over whole columns.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, NamedTuple

import numpy as np

from . import _rules
from ._codes import EXPANDABLE_SEGMENTS, LOSS_FULL
from ._config import parallel_layout
from ._factorize import factorize
from ._fast import _kernel
from ._frameworks import loss_policy
from ._grid import ATTENTION, PRECISIONS, RECOMPUTE, Grid
from ._load import cached_load_reserve_bytes
from ._lora import lora_zero3
from ._model import ModelSpec
from ._overhead import Overheads, num_communicators
from ._peaks import (
    PEAK_BACKWARD,
    PEAK_FORWARD,
    PEAK_OPTIMIZER_STEP,
    STAGE_COLUMNS,
    STAGE_PEAKS,
    fragmentation_bytes,
    stage_peaks,
)
from ._pipeline import STAGE_LAST, STAGE_ONLY, stage_position
from ._rank_activations import ACT_KEYS, activation_terms
from ._rank_states import STATE_KEYS, state_terms
from ._rules import (
    PROFILE_MISMATCH,
    RuleModel,
    broken_rule,
    reasons_of,
)
from ._tensor_parallel import sequence_parallel_on

COMPONENTS = (
    "parameters",
    "master_weights",
    "gradients",
    "optimizer_states",
    "activations",
    "transient",
    "framework_overhead",
    "fragmentation",
)
"""The per-device breakdown at the peak; they sum to peak_device_bytes exactly."""

PHASES = ("forward", "backward", "optimizer_step")

assert tuple(map(PHASES.index, PHASES)) == (PEAK_FORWARD, PEAK_BACKWARD, PEAK_OPTIMIZER_STEP)
assert (PEAK_FORWARD, PEAK_BACKWARD) == (False, True), "peak_phase codes a bool comparison"


BLOCK_ROWS = 16384
"""Rows assembled per pass: the per-row temporaries of a block stay in the CPU cache."""

OUTPUTS = (
    *COMPONENTS[:6],
    "framework_overhead",
    "fragmentation",
    "gradients_total",
    "activations_total",
    "activations_per_layer",
    "activations_outside_layers",
    "activations_autocast_weight_copies",
    "optimizer_step_temporaries",
    "host_bytes",
    "paged_optimizer_bytes",
    "peak_forward_bytes",
    "peak_backward_bytes",
    "peak_optimizer_step_bytes",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "peak_device_bytes",
    "peak_phase",
    "pp_stage",
    "dp",
    "num_microbatches",
    "fits",
    "headroom_bytes",
    "reason",
    "peak_load_bytes",
    "load_host_bytes",
)
"""Every column `estimate` returns, in order."""

_STAGE_OUT = {  # estimate() column -> _assemble column, where they differ
    "gradients": "grads_at_peak",
    "activations": "acts_at_peak",
}
_S_TERMS = (
    "gradients",
    "grads_persistent",
    "persistent",
    "fsdp_fwd",
    "end_grads",
    "top_grads",
    "tied_embedding_grad",
    "optimizer_peak",
    "states",
    "parameters",
    "master_weights",
    "optimizer_states",
    "load_peak",
    "load_host_bytes",
    "accum_end_grads",
    "fsdp_bwd_start",
    "unsharded_accum_grads",
)
_A_TERMS = (
    "stage_act",
    "recompute_excess",
    "activations_autocast_weight_copies",
    "pipe_per_micro",
    "pipe_fixed",
    "fwd_max",
    "bwd_start_extra",
    "bwd_end_extra",
    "embed_extra",
    "recompute_extra",
    "small",
    "step_held",
    "largest_block",
)
_OPTIONAL_TERMS = {  # output column -> (state terms, activation terms) it needs besides
    "optimizer_step_temporaries": (("optimizer_step_temporaries",), ()),
    "activations_per_layer": ((), ("activations_per_layer",)),
    "activations_outside_layers": ((), ("activations_outside_layers",)),
    "host_bytes": (("host_bytes", "host_accum_bytes"), ("activations_offloaded",)),
    "paged_optimizer_bytes": (("paged_optimizer_bytes",), ()),
}


KEY_BLOCK = 16384
"""Keys whose terms are evaluated in one pass: each of the formulas' few hundred temporaries
(128 KiB) stays in the CPU cache; a random grid has about one distinct key per two rows."""

_SMALL_TABLE = 1 << 17
"""Per-key tables up to this many values (1 MiB) are gathered term by term (they stay cached)."""


class _Tables(NamedTuple):
    """Per-key terms of one pipeline-stage variant, one row per term (terms x keys)."""

    state: np.ndarray
    activation: np.ndarray


def _key_tables(
    m: ModelSpec,
    cols: dict[str, np.ndarray],
    stage_pos: Sequence[np.ndarray | None],
    terms: tuple[list[str], list[str]],
) -> tuple[np.ndarray, np.ndarray, list[_Tables]]:
    """(state key per row, activation key per row, the per-key `terms` of each variant).

    `stage_pos` [None]: the rows' own `stage_pos` column is part of the keys (one variant). Else
    one array per variant: the keys leave stage_pos out and each variant evaluates the terms on
    the same representatives with its own stage_pos (only where it differs from the first's).
    """
    own = stage_pos[0] is None
    keys = [[k for k in fields if own or k != "stage_pos"] for fields in (STATE_KEYS, ACT_KEYS)]
    codes = [factorize([cols[k] for k in fields]) for fields in keys]
    variants: list[_Tables] = []
    for pos in stage_pos:
        tables = []
        for j, ((_, reps), fields, names) in enumerate(zip(codes, keys, terms, strict=True)):
            sub = {k: cols[k][reps] for k in fields}
            redo = None
            if pos is not None:
                sub["stage_pos"] = pos[reps]
                if variants:  # evaluate only the keys whose stage differs from the first's
                    redo = np.flatnonzero(sub["stage_pos"] != stage_pos[0][reps])  # type: ignore[index]
                    sub = {k: v[redo] for k, v in sub.items()}
            base = variants[0][j] if variants else None
            tables.append(_table(m, _TABLE_TERMS[j], sub, names, base=base, redo=redo))
        variants.append(_Tables(*tables))
    return codes[0][0], codes[1][0], variants


def _state_table_terms(m: ModelSpec, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """state_terms and their sum `states` (parameters, master weights, optimizer states)."""
    t = state_terms(m, c)
    t["states"] = t["parameters"] + t["master_weights"] + t["optimizer_states"]
    return t


def _activation_table_terms(m: ModelSpec, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """activation_terms and `fwd_max`, the larger of the two forward transients."""
    t = activation_terms(m, c)
    t["fwd_max"] = np.maximum(t["fwd_extra"], t["fwd_block_extra"])
    return t


_TABLE_TERMS = (_state_table_terms, _activation_table_terms)


def _table(
    m: ModelSpec,
    fn,
    sub: dict[str, np.ndarray],
    names: list[str],
    *,
    base: np.ndarray | None,
    redo: np.ndarray | None,
) -> np.ndarray:
    """The table of `fn`'s terms `names` on the keys `sub`: terms x keys, a large one as the
    transpose of a keys x terms C array (see _block_terms). `base`: the first variant's table,
    of which only the keys `redo` (those `sub` holds) are evaluated anew.

    The formulas run as the model's compiled kernel where _kernel.formulas_for gives one (keys x
    terms as they come), else numpy's in cache-sized blocks of KEY_BLOCK keys."""
    num = len(sub["tp"])
    compiled = _kernel.formulas_for(m, fn, sub, num)
    if compiled is not None:
        fresh = compiled.table(sub, names)
        if base is None:
            return _stored(fresh)
        by_key = np.array(base.T, order="C")
        by_key[redo] = fresh
        return _stored(by_key)
    table = np.empty((len(names), num)) if base is None else np.array(base, copy=True)
    keys = np.arange(num) if redo is None else redo
    for lo in range(0, num, KEY_BLOCK):  # the keys in cache-sized blocks
        block = slice(lo, lo + KEY_BLOCK)
        terms_of = fn(m, sub if num <= KEY_BLOCK else {k: v[block] for k, v in sub.items()})
        rows = keys[block]
        for i, k in enumerate(names):
            table[i, rows] = np.broadcast_to(terms_of[k], (len(rows),))
    return _stored(table.T)


def _stored(by_key: np.ndarray) -> np.ndarray:
    """A per-key table (keys x terms, any order) as _Tables keep it: terms x keys, C order when
    small, else the transpose of a keys x terms C array (a key's terms share cache lines; see
    _block_terms)."""
    if by_key.size > _SMALL_TABLE:
        return np.ascontiguousarray(by_key).T
    return np.ascontiguousarray(by_key.T)


def _block_terms(
    t: _Tables, terms: tuple[list[str], list[str]], i_s: np.ndarray, i_a: np.ndarray
) -> dict[str, np.ndarray]:
    """The terms of a block of rows: one gather per table (a row per term, contiguous)."""
    rows: dict[str, np.ndarray] = {}
    for table, names, idx in zip(t, terms, (i_s, i_a), strict=True):
        if table.flags.c_contiguous:  # terms x keys: a gather per term, rows contiguous
            rows.update(zip(names, np.take(table, idx, axis=1), strict=True))
        else:  # a large table, keys x terms: one row gather (a key's terms share cache lines)
            rows.update(zip(names, table.T[idx].T, strict=True))
    return rows


def _assemble(
    T: dict[str, np.ndarray],
    *,
    g: dict[str, np.ndarray],
    stage: np.ndarray,
    num_micro: np.ndarray,
    want: frozenset[str],
) -> dict[str, np.ndarray]:
    """Phase peaks (allocated bytes) of a block of rows on the stage `stage` names.

    Everything that depends on the layout only or on the micro-batch shape only comes in `T`,
    precombined by the per-key passes; what is left per row is a few dozen array operations.
    `want`: the optional columns to return besides those estimate() always needs.
    """
    peaks = stage_peaks(T, g, stage=stage, num_micro=num_micro)
    out = {
        "grads_at_peak": peaks["gradients"],
        "acts_at_peak": peaks["activations"],
        "transient": peaks["transient"],
        "peak_allocated_bytes": peaks["peak_allocated_bytes"],
    }
    optional = ("peak_phase", "gradients_total", "activations_total", *STAGE_PEAKS[:3])
    out.update({k: peaks[k] for k in optional if k in want})
    if "host_bytes" in want:
        out["host_bytes"] = host_bytes_of(
            T["host_bytes"],
            T["host_accum_bytes"],
            peaks["in_flight"] * T["activations_offloaded"],
            num_micro,
        )
    out.update(
        {
            k: T[k]
            for k in (*_OPTIONAL_TERMS, "activations_autocast_weight_copies")
            if k in want and k != "host_bytes"
        }
    )
    out.update({k: T[k] for k in ("parameters", "master_weights", "optimizer_states")})
    out["largest_block"] = T["largest_block"]
    return out


def layout_reason(m: ModelSpec, g: Grid) -> np.ndarray:
    """Index into REASONS of the first rule each row breaks (0 = valid): masks, not exceptions.

    Evaluated in blocks of BLOCK_ROWS rows, whose temporaries stay in the CPU cache, or in
    one compiled loop for a large grid (engine/_fast/_kernel.py).
    """
    n = len(g["tp"])
    compiled = _kernel.compiled_for(n) if m.profile is None else None
    if compiled is not None:
        return _kernel.layout_reason(compiled, m, g)
    if n <= BLOCK_ROWS:
        return _block_reason(m, g)
    reason = np.empty(n, dtype=np.int8)
    for lo in range(0, n, BLOCK_ROWS):
        rows = slice(lo, lo + BLOCK_ROWS)
        reason[rows] = _block_reason(m, {k: v[rows] for k, v in g.items()})
    return reason


def _block_reason(m: ModelSpec, g: Grid) -> np.ndarray:
    """layout_reason of a block of rows: the first rule of engine/_rules.RULES each row
    breaks. A column that is one value broadcast (make_grid's scalars: the fixed fields of a
    sweep) enters as that one value, so that its rules are evaluated once, not per row."""
    n = len(g["tp"])
    g = {k: _one_value(v) for k, v in g.items()}
    reason = np.broadcast_to(broken_rule(RuleModel.of(m), g), (n,)).astype(np.int8)
    if m.profile is not None:  # a traced profile: its own rule first
        reason = np.where(profile_mismatch(m, g), PROFILE_MISMATCH, reason).astype(np.int8)
    return reason


def _one_value(column: np.ndarray) -> np.ndarray:
    """A column that is one value broadcast over its rows (stride 0) as that one value (a
    one-row array); any other column as it is."""
    if column.ndim == 1 and len(column) > 1 and column.strides[0] == 0:
        return column[:1]
    return column


def profile_mismatch(m: ModelSpec, g: Grid) -> np.ndarray:
    """Rows a traced profile does not describe: another precision, recompute policy or attention
    than traced, any tensor, context or expert parallelism, LoRA/QLoRA, the chunked loss."""
    p = m.profile
    assert p is not None
    return (
        (g["precision"] != PRECISIONS.index(p.precision))
        | (g["recompute"] != RECOMPUTE.index(p.recompute))
        | (g["attention"] != ATTENTION.index(p.attention))
        | (g["tp"] != 1)
        | (g["cp"] != 1)
        | (g["ep"] != 1)
        | (g["etp"] != 1)
        | (g["lora_rank"] != 0)
        | g["qlora"]
        | (loss_policy(g["framework"], g["loss"]) != LOSS_FULL)
    )


def reason_text(code: int) -> str:
    """The sentence for a `reason` code (empty for a valid layout), of the rules as they are."""
    return reasons_of(_rules.RULES)[int(code)]


def estimate(
    m: ModelSpec,
    g: Grid,
    *,
    usable_bytes: float | np.ndarray = np.inf,
    headroom: float | np.ndarray = 0.10,
    overheads: Overheads | None = None,
    pp_stage: int | np.ndarray | None = None,
    columns: Collection[str] | None = None,
    reason: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Per-device memory of every row of `g` for model `m`.

    By default the worst rank (the pipeline stage with the larger allocated peak, first or last);
    `pp_stage` (0-based, per row or scalar) asks for one stage instead.
    Returns columns (float64 bytes unless said otherwise): the COMPONENTS at the peak (they sum to
    peak_device_bytes), gradients_total and activations_total (persistent gradients; activations
    saved at the end of forward), per-layer details, peak_allocated_bytes / peak_reserved_bytes /
    peak_device_bytes, the phase peaks, peak_phase (0 forward, 1 backward, 2 optimizer_step),
    pp_stage, dp, num_microbatches, fits (bool), headroom_bytes, reason (int8 into REASONS).
    `columns`: only these of OUTPUTS (the same values as the full call, less work); `reason`:
    layout_reason(m, g) when the caller has it already.
    """
    asked = frozenset(OUTPUTS if columns is None else columns)
    unknown = sorted(asked - set(OUTPUTS))
    if unknown:
        raise ValueError(f"columns: unknown {', '.join(unknown)}; allowed: {', '.join(OUTPUTS)}")
    # the load's cached reserve (_load_reserve) raises all three from the device peak
    want = asked | frozenset(_RESERVE_COLUMNS) if asked & set(_RESERVE_COLUMNS) else asked
    ov = overheads or Overheads()
    reason = layout_reason(m, g) if reason is None else reason
    tp, pp, cp = g["tp"], g["pp"], g["cp"]
    n = len(tp)
    dp, _, num_micro = batch_layout(g)
    sp = sequence_parallel_on(g["sequence_parallel"], tp, g["framework"])
    terms = _wanted_terms(want)
    compiled = _kernel.compiled_for(n)  # loads numba first where the rows pay (formulas too)
    derived = {"dp": dp, "sp": sp, "lora_zero3": lora_zero3(g["zero"], g["lora_rank"])}
    stages, keys = _stage_variants(m, {**g, **derived}, pp, pp_stage, terms)
    limit = _usable_limit(usable_bytes, headroom, n)
    outside_torch, framework_overhead = _outside_torch(ov, dp=dp, tp=tp, pp=pp, cp=cp)
    job = _Job(
        keys,
        terms,
        stages,
        g,
        want,
        ov,
        num_micro,
        limit,
        reason,
        outside_torch,
        framework_overhead,
    )
    out = _numpy_columns(job) if compiled is None else _compiled_columns(compiled, job)
    out.update(_with_load(out, keys, terms, limit=limit, outside_torch=outside_torch))
    whole = {"dp": dp, "num_microbatches": num_micro, "reason": reason}
    for k in want - out.keys():  # no rows, or a whole-grid column
        out[k] = whole[k] if k in whole else np.empty(0, dtype=OUTPUT_DTYPES.get(k, np.float64))
    return {k: out[k] for k in OUTPUTS if k in asked}


OUTPUT_DTYPES: dict[str, type] = {
    "peak_phase": np.int8,
    "fits": bool,
    "pp_stage": np.int64,
    "dp": np.int64,
    "reason": np.int8,
}
"""estimate()'s columns that are not float64, and their dtypes (every other column is float64;
tests/unit/engine/test_scalar.py holds estimate() to it)."""


def batch_layout(g: Grid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dp, global batch, micro-batches per step) of every row: dp = num_gpus / (tp pp cp);
    `global_batch_size` 0 means micro_batch_size x dp (no gradient accumulation)."""
    layout = parallel_layout(g)
    num_micro = np.maximum(layout["grad_accum_steps"], 1).astype(np.float64)
    return layout["dp"], layout["global_batch_size"], num_micro


def _outside_torch(ov: Overheads, *, dp, tp, pp, cp) -> tuple[np.ndarray, np.ndarray]:
    """(device bytes outside PyTorch's allocator: CUDA context and NCCL buffers, the framework
    overhead column: those and the cuBLAS workspace) per row. Source: Overheads."""
    outside_torch = ov.cuda_context_bytes + ov.nccl_bytes_per_communicator * num_communicators(
        dp=dp, tp=tp, pp=pp, cp=cp
    )
    return outside_torch, np.broadcast_to(outside_torch + ov.cublas_workspace_bytes, (len(tp),))


def _wanted_terms(want: frozenset[str]) -> tuple[list[str], list[str]]:
    """(state terms, activation terms) the per-key tables hold for the `want`ed columns."""
    terms: tuple[list[str], list[str]] = (list(_S_TERMS), list(_A_TERMS))
    for k, (s_terms, a_terms) in _OPTIONAL_TERMS.items():
        if k in want:
            terms[0].extend(s_terms)
            terms[1].extend(a_terms)
    return terms


class _Keys(NamedTuple):
    """Per-row key indices into the per-key tables, and the tables of each stage variant."""

    state: np.ndarray
    activation: np.ndarray
    variants: list[_Tables]


def _stage_variants(
    m: ModelSpec,
    base: dict[str, np.ndarray],
    pp: np.ndarray,
    pp_stage: int | np.ndarray | None,
    terms: tuple[list[str], list[str]],
) -> tuple[list[np.ndarray], _Keys]:
    """(the stage of each variant per row, the per-key tables of the variants).

    With `pp_stage`: that stage, one variant. Else the first stage, and the last too where some
    rows are pipelined (the worst rank is one of them).
    """
    n = len(pp)
    if pp_stage is not None:
        stages = [np.minimum(np.broadcast_to(np.asarray(pp_stage, dtype=np.int64), (n,)), pp - 1)]
        base["stage_pos"] = stage_position(stages[0], pp)
        return stages, _Keys(*_key_tables(m, base, [None], terms))
    first_stage = np.zeros(n, dtype=np.int64)
    stages = [first_stage]
    positions = [stage_position(first_stage, pp)]
    if np.any(pp > 1):
        stages.append(np.maximum(pp - 1, 0))
        positions.append(np.where(pp <= 1, STAGE_ONLY, STAGE_LAST).astype(np.int8))
    return stages, _Keys(*_key_tables(m, base, positions, terms))


def _worst_rank(
    keys: _Keys,
    terms: tuple[list[str], list[str]],
    stages: list[np.ndarray],
    rows: slice,
    kw: dict[str, Any],
    want: frozenset[str],
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(_assemble's columns, the stage) of the worst rank of a block of rows: the first stage's,
    or the last stage's where its allocated peak is larger (`stages`: this block's, per
    variant)."""
    bs, ba, variants = keys.state[rows], keys.activation[rows], keys.variants
    worst = _assemble(_block_terms(variants[0], terms, bs, ba), stage=stages[0], want=want, **kw)
    stage = stages[0]
    if len(variants) == 1:
        return worst, stage
    needs_stage = "pp_stage" in want
    multi = kw["g"]["pp"] > 1
    if multi.all():
        last = _assemble(_block_terms(variants[1], terms, bs, ba), stage=stages[1], want=want, **kw)
        pick = last["peak_allocated_bytes"] > worst["peak_allocated_bytes"]
        worst = {k: np.where(pick, last[k], x) for k, x in worst.items()}
        if needs_stage:
            stage = np.where(pick, stages[1], stage)
    elif multi.any():  # the pipelined rows only
        sub = np.flatnonzero(multi)
        T = _block_terms(variants[1], terms, bs[sub], ba[sub])
        g = {k: x[sub] for k, x in kw["g"].items()}
        last = _assemble(T, g=g, stage=stages[1][sub], want=want, num_micro=kw["num_micro"][sub])
        pick = last["peak_allocated_bytes"] > worst["peak_allocated_bytes"][sub]
        for k, x in worst.items():  # fresh arrays of this block: updated in place
            x[sub[pick]] = last[k][pick]
        if needs_stage:
            stage = stage.copy()
            stage[sub[pick]] = stages[1][sub[pick]]
    return worst, stage


class _Job(NamedTuple):
    """What the per-row assembly of a grid needs: the per-key tables and their terms, the stage
    of each variant per row, the grid, the wanted columns, the overheads, and per row the
    micro-batches per step, the usable limit, the layout reason and the bytes outside torch
    (the framework overhead column too)."""

    keys: _Keys
    terms: tuple[list[str], list[str]]
    stages: list[np.ndarray]
    g: Grid
    want: frozenset[str]
    ov: Overheads
    num_micro: np.ndarray
    limit: np.ndarray
    reason: np.ndarray
    outside_torch: np.ndarray
    framework_overhead: np.ndarray


def _numpy_columns(job: _Job) -> dict[str, np.ndarray]:
    """The `want`ed per-row columns of every row, numpy's way: blocks of BLOCK_ROWS rows whose
    temporaries stay in the CPU cache (the reference for the compiled loop)."""
    keys, terms, stages, g, want, ov, num_micro, limit, reason, outside_torch, overhead = job
    n = len(reason)
    out: dict[str, np.ndarray] = {}
    for lo in range(0, n, BLOCK_ROWS):
        rows = slice(lo, min(lo + BLOCK_ROWS, n))
        kw = {"g": {k: g[k][rows] for k in STAGE_COLUMNS}, "num_micro": num_micro[rows]}
        worst, stage = _worst_rank(keys, terms, [x[rows] for x in stages], rows, kw, want)
        block = _device_columns(worst, ov, outside_torch=outside_torch[rows], g=g, rows=rows)
        block.update(
            framework_overhead=overhead[rows],
            pp_stage=stage,
            fits=(block["peak_device_bytes"] <= limit[rows]) & (reason[rows] == 0),
            headroom_bytes=limit[rows] - block["peak_device_bytes"],
        )
        for k in want & block.keys():
            if k not in out:
                out[k] = np.empty(n, dtype=block[k].dtype)
            out[k][rows] = block[k]
    return out


def _compiled_columns(module, job: _Job) -> dict[str, np.ndarray]:
    """The `want`ed columns of every row from the compiled loop (engine/_fast/_kernel.py): the same
    values as _worst_rank, _device_columns and the fit of the numpy blocks."""
    keys, terms, stages, g, want, ov, num_micro, limit, reason, outside_torch, overhead = job
    n = len(reason)
    passed = [k for k in (*_OPTIONAL_TERMS, "activations_autocast_weight_copies") if k in want]
    if "host_bytes" in want:
        passed += ["host_accum_bytes", "activations_offloaded"]
    extra = (
        [terms[0].index(k) for k in passed if k in terms[0]],
        [terms[1].index(k) for k in passed if k in terms[1]],
    )
    rows = {
        **{k: g[k] for k in STAGE_COLUMNS},
        "num_micro": num_micro,
        "expandable": g["allocator"] == EXPANDABLE_SEGMENTS,
        "outside_torch": np.broadcast_to(outside_torch, (n,)),
        "limit": limit,
        "reason": reason,
    }
    consts = (
        ov.cublas_workspace_bytes,
        ov.fragmentation_fraction,
        ov.expandable_segments_fragmentation_fraction,
        ov.fragmentation_largest_block_factor,
    )
    cols, extra_out = _kernel.assemble(
        module, keys.variants, (keys.state, keys.activation), stages, rows, consts, extra
    )
    named = [k for t in terms for k in passed if k in t]  # extra_out's rows: state terms first
    cols.update(zip(named, extra_out, strict=True))
    cols["framework_overhead"] = overhead
    if "host_bytes" in want:
        cols["host_bytes"] = host_bytes_of(
            cols["host_bytes"],
            cols["host_accum_bytes"],
            cols["in_flight"] * cols["activations_offloaded"],
            num_micro,
        )
    return {k: cols[k] for k in want if k in cols}


def host_bytes_of(host, host_accum, activations_offloaded, num_micro) -> np.ndarray:
    """A rank's host bytes: its model states' (`host`), what gradient accumulation adds there
    (`host_accum`, DeepSpeed's accumulated_grads_in_cpu), and the activations it offloads."""
    return host + np.where(num_micro > 1, host_accum, 0.0) + activations_offloaded


def _usable_limit(usable_bytes, headroom, n: int) -> np.ndarray:
    """The bytes a row's device may hold: usable memory less the headroom, per row."""
    usable = np.asarray(usable_bytes, dtype=np.float64)
    return np.broadcast_to(usable * (1.0 - np.asarray(headroom, dtype=np.float64)), (n,))


def _with_load(
    out: dict[str, np.ndarray],
    keys: _Keys,
    terms: tuple[list[str], list[str]],
    *,
    limit: np.ndarray,
    outside_torch: np.ndarray,
) -> dict[str, np.ndarray]:
    """The load phase's columns of every row, and the step's fit and headroom judged with it.

    peak_load_bytes: device bytes at the load's peak (engine/_load.py), the worse of the
    pipeline's first and last stages, with the CUDA context and NCCL buffers (the process group
    exists before the model loads); load_host_bytes: the host RAM a rank holds then. `fits`
    needs the load to fit too; `headroom_bytes` is the smaller margin of the two phases.
    Ignores: fragmentation and the cuBLAS workspace during the load (no matmul runs).
    """
    if not len(limit):
        return {}
    i_peak, i_host = terms[0].index("load_peak"), terms[0].index("load_host_bytes")
    peak = np.max([t.state[i_peak][keys.state] for t in keys.variants], axis=0)
    host = np.max([t.state[i_host][keys.state] for t in keys.variants], axis=0)
    device = peak + np.broadcast_to(outside_torch, peak.shape)
    cols = {"peak_load_bytes": device, "load_host_bytes": host}
    cols.update(_load_reserve(out, device))
    if "fits" in out:
        cols["fits"] = out["fits"] & (device <= limit)
    if "headroom_bytes" in out:
        cols["headroom_bytes"] = np.minimum(out["headroom_bytes"], limit - device)
    return cols


def _load_reserve(out: dict[str, np.ndarray], load_device: np.ndarray) -> dict[str, np.ndarray]:
    """The step's reserved and device peaks (and fragmentation, so that the breakdown still
    sums to the device peak) raised to the load's where the load reserved more
    (cached_load_reserve_bytes); only the columns `out` has."""
    if "peak_device_bytes" not in out:
        return {}
    kept = cached_load_reserve_bytes(load_device, out["peak_device_bytes"])
    return {k: out[k] + kept for k in _RESERVE_COLUMNS if k in out}


_RESERVE_COLUMNS = ("peak_reserved_bytes", "peak_device_bytes", "fragmentation")


def _fragmentation_consts(ov: Overheads) -> dict[str, float]:
    """fragmentation_bytes' overheads."""
    return {
        "fraction": ov.fragmentation_fraction,
        "expandable_fraction": ov.expandable_segments_fragmentation_fraction,
        "largest_block_factor": ov.fragmentation_largest_block_factor,
    }


def _device_columns(
    worst: dict[str, np.ndarray], ov: Overheads, *, outside_torch: np.ndarray, g: Grid, rows
) -> dict[str, np.ndarray]:
    """The output columns of a block of rows from the worst rank's allocated peak: reserved
    (cuBLAS workspace, allocator fragmentation of the non-persistent bytes, smaller with
    expandable segments: the `allocator` of the grid `g`'s `rows`) and device (CUDA context,
    NCCL) bytes.
    Source: Overheads."""
    peak_allocated = worst["peak_allocated_bytes"]
    fragmentation = fragmentation_bytes(
        peak_allocated,
        (
            worst["parameters"],
            worst["master_weights"],
            worst["optimizer_states"],
            worst["grads_at_peak"],
        ),
        worst["largest_block"],
        g["allocator"][rows] == EXPANDABLE_SEGMENTS,
        **_fragmentation_consts(ov),
    )
    peak_reserved = peak_allocated + ov.cublas_workspace_bytes + fragmentation
    return {
        **{k: worst[_STAGE_OUT.get(k, k)] for k in OUTPUTS if _STAGE_OUT.get(k, k) in worst},
        "fragmentation": fragmentation,
        "peak_reserved_bytes": peak_reserved,
        "peak_device_bytes": peak_reserved + outside_torch,
    }
