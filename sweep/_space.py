"""The search space of a sweep: axes of candidate values, enumerated lazily as columnar grids.

A point is one index per axis; the space is the cartesian product of the axes. Any range of flat
point indices becomes a grid (one numpy array per field) with `np.unravel_index`, so the
exhaustive search walks the space in chunks and Optuna builds the grid of a batch of trials the
same way. Invalid points stay, with a reason: the engine's layout rules (REASONS) plus the
sweep's own (SWEEP_REASONS), never exceptions.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from trainmem.engine import (
    COMPONENTS,
    DEFAULTS_BY_FIELD,
    REASONS,
    ModelSpec,
    Overheads,
    TimeParams,
    estimate,
    estimate_time,
    grid_columns,
    layout_reason,
    make_grid,
    node_host_bytes,
    parallel_layout,
    ranks_per_node,
    resolved_loss,
    time_inputs,
)
from trainmem.engine._rl import trainer_grid
from trainmem.hardware import Fleet, GpuProfile, Pool
from trainmem.report import (
    check_lora_rank,
    check_overhead_bytes,
    error_bar_columns,
    gpu_overheads,
    precision_reason,
    regime_of,
    runnable_precision,
    seq_len_warnings,
)
from trainmem.report._rl import fold_rl, is_rl, rl_columns

from ._axes import AXES, NAMED_AXES, RL_AXES, declared_values
from ._options import SEARCH_DEFAULTS
from ._risk import SpaceRisk, null_columns, risk_columns, scatter, step_lengths

SWEEP_REASONS = (
    "tp crosses a node (tp > gpus per node)",
    "num_gpus exceeds the pool",
    "virtual_stages > 1 needs pp > 1",
    "host memory: the node's ranks need more host RAM than the node has (CPU offload)",
    "num_gpus is not the whole pool (--use-all-gpus)",
    "step time above --max-step-time",
    "cost above --max-cost-per-million-tokens",
    "precision: the pool's GPU has no rate for one of its matmul formats (bf16, fp8)",
)
"""The sweep's own invalid-point reasons; their codes follow the engine's REASONS (new ones are
appended: a stored point's reason is its text, a code only lives in memory)."""
ALL_REASONS = REASONS + SWEEP_REASONS
(
    TP_CROSSES_NODE,
    EXCEEDS_POOL,
    VIRTUAL_WITHOUT_PP,
    EXCEEDS_HOST_MEMORY,
    PART_OF_POOL,
    SLOWER_THAN_MAX,
    COSTLIER_THAN_MAX,
    PRECISION_UNSUPPORTED,
) = range(len(REASONS), len(ALL_REASONS))


def _powers_of_two(cap: int) -> list[int]:
    return [1 << k for k in range(max(int(cap), 1).bit_length())]


def gpu_counts(fleet: Fleet) -> list[int]:
    """Candidate GPU counts: powers of two and whole nodes, up to the largest pool.

    Assumes: a job uses one pool; counts that are not whole nodes above one node are skipped
    (they leave GPUs of a node idle).
    """
    counts: set[int] = set()
    for pool in fleet.pools:
        counts.update(c for c in _powers_of_two(pool.num_gpus))
        counts.update(pool.gpus_per_node * k for k in _powers_of_two(pool.num_nodes))
        counts.add(pool.num_gpus)
    return sorted(counts)


@dataclass(frozen=True, slots=True, kw_only=True)
class Space:
    """A sweep's axes (candidate values per field) and its fixed fields."""

    model: ModelSpec
    """The model trained."""
    fleet: Fleet
    """The pools a job may use (one pool per job)."""
    gpus: Mapping[str, GpuProfile]
    """GPU profiles by name (what `load_gpus()` returns)."""
    axes: dict[str, tuple[Any, ...]]
    """Candidate values per AXES field (pool: pool indices; categoricals: names)."""
    fixed: dict[str, Any] = field(default_factory=dict)
    """Grid fields shared by every point (seq_len, global_batch_size, precision, ...)."""
    headroom: float = 0.10
    """Fraction of usable memory kept free."""
    labels: dict[str, Any] = field(default_factory=dict)
    """The job's training fields that are not axes, by name (the points table's columns)."""
    host_memory_bytes: int | None = None
    """Host RAM of one node, bytes, for every pool (None: each pool's or its profile's)."""
    use_all_gpus: bool = False
    """Only points that take their whole pool are valid (others: PART_OF_POOL)."""
    max_step_time_s: float | None = None
    """Points slower than this (step time, s) are not valid (SLOWER_THAN_MAX); None: any."""
    max_cost_per_million_tokens: float | None = None
    """Points dearer than this ($ per million tokens) are not valid (COSTLIER_THAN_MAX)."""
    unsupported_pools: tuple[int, ...] = ()
    """Pools whose GPU cannot run the precision (report.precision_reason): their points are
    invalid (PRECISION_UNSUPPORTED), never proposed."""
    warnings: tuple[str, ...] = ()
    """What the job should know (a sequence beyond the model's rotary positions)."""
    risk: SpaceRisk | None = None
    """`--lengths`: a point fits only if its epoch's OOM probability is within the risk
    (sweep/_risk.py; its risk columns); None: the fit at seq_len."""
    overheads: dict[str, float] = field(default_factory=dict)
    """Overhead values (engine Overheads' names: --overhead-file, --overhead) put over every
    pool's own defaults: a key given replaces each GPU's own value (its TOML's CUDA context,
    its architecture's cuBLAS workspace), the keys not given stay each GPU's; {}: every pool's
    defaults (`gpu_overheads`)."""

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(self.axes[a]) for a in AXES)

    @property
    def num_points(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def columns(self, flat: np.ndarray | range) -> dict[str, np.ndarray]:
        """The AXES values of flat point indices (categoricals as codes).

        `flat` a range (step 1, as the exhaustive search's chunks): each column is built from
        runs of its values (repeat and tile), with no per-point index arithmetic or gather.
        """
        if isinstance(flat, range) and flat.step == 1:
            strides = np.cumprod((1, *self.shape[:0:-1]))[::-1]
            return {
                a: _range_column(_axis_array(a, self.axes[a]), int(st), flat.start, flat.stop)
                for a, st in zip(AXES, strides, strict=True)
            }
        idx = np.unravel_index(np.asarray(flat, dtype=np.int64), self.shape)
        return {a: _axis_array(a, self.axes[a])[i] for a, i in zip(AXES, idx, strict=True)}

    def evaluate(
        self,
        flat: np.ndarray | range,
        *,
        time_params: TimeParams | None = None,
        columns: Collection[str] | None = None,
    ) -> dict:
        """Memory, fit, time and cost of the points `flat`: one vectorized call, no row loop."""
        cols = self.columns(flat)
        return evaluate_columns(self, cols, time_params=time_params, columns=columns)


_NAMES = NAMED_AXES
"""Axes whose values are names (the others are whole numbers or switches), with their
vocabularies."""


def _axis_array(axis: str, values: tuple[Any, ...]) -> np.ndarray:
    """An axis's values as numbers: names become their codes (index into the vocabulary)."""
    if axis in _NAMES:
        return np.array([_NAMES[axis].index(v) for v in values], dtype=np.int8)
    return np.asarray(values, dtype=np.int64)


def _range_column(values: np.ndarray, stride: int, lo: int, hi: int) -> np.ndarray:
    """values[(i // stride) % len(values)] for i in range(lo, hi): one axis of a contiguous
    range of flat indices whose later axes hold `stride` points together."""
    if hi <= lo:
        return values[:0]
    period = len(values) * stride
    if period <= hi - lo:  # an inner axis: tile one period of runs
        start = lo % period
        reps = -(-(start + hi - lo) // period)
        return np.tile(np.repeat(values, stride), reps)[start : start + hi - lo]
    first, last = lo // stride, (hi - 1) // stride  # an outer axis: a few runs, ends cut
    counts = np.full(last - first + 1, stride, dtype=np.int64)
    counts[0] -= lo - first * stride
    counts[-1] -= (last + 1) * stride - hi
    return np.repeat(values[np.arange(first, last + 1) % len(values)], counts)


def _codes(axis: str, values: np.ndarray) -> np.ndarray:
    """Codes of a name-valued column given as names or codes."""
    values = np.asarray(values)
    if values.dtype.kind in "iu":
        return values.astype(np.int8)
    uniq, inverse = np.unique(values.astype(str), return_inverse=True)
    return _axis_array(axis, tuple(uniq))[inverse]


POINT_COLUMNS = (
    *COMPONENTS,
    "peak_allocated_bytes",
    "peak_device_bytes",
    "headroom_bytes",
    "peak_load_bytes",
)
TIMED_COLUMNS = ("step_time_s", "tokens_per_second", "mfu", "cost_per_million_tokens")
"""The estimate_time() columns every evaluated point gets."""
"""The estimate() columns a search keeps (`evaluate_columns(columns=...)`), besides the fit,
reason and dp it always gets."""


def evaluate_columns(
    space: Space,
    cols: dict[str, np.ndarray],
    *,
    time_params: TimeParams | None = None,
    columns: Collection[str] | None = None,
    time_columns: Collection[str] = (),
) -> dict[str, np.ndarray]:
    """Evaluate AXES columns (plus the space's fixed fields): inputs and outputs as columns.

    Name-valued axes (recompute, offload) may come as names or codes; they go out as codes
    (see `_NAMES`), the GPU as the pool index (`pool`). `columns`: the estimate() columns
    wanted (None: all; fits, reason and dp always); `time_columns`: estimate_time() columns
    wanted besides TIMED_COLUMNS (e.g. the step's parts, engine TIME_COLUMNS).
    """
    pool = cols["pool"].astype(np.int64)
    num_gpus = cols["num_gpus"].astype(np.int64)
    tp, pp = cols["tp"].astype(np.int64), cols["pp"].astype(np.int64)
    cols = {**cols, **{a: _codes(a, cols[a]) for a in _NAMES}}
    grid_cols = {a: cols[a] for a in AXES if a != "pool"}
    grid = make_grid({**space.fixed, **grid_cols})
    pools = _pool_columns(space, pool)
    engine_reason = layout_reason(space.model, grid)
    reason = _layout_reasons(space, grid, engine_reason, pools, num_gpus=num_gpus, tp=tp, pp=pp)
    if space.risk is not None and columns is not None:  # the load's fit, judged with the risk
        columns = {*columns, "peak_load_bytes"}
    out = _estimate_by_overheads(space, grid, pools, engine_reason=engine_reason, columns=columns)
    reason = _host_reasons(space, pools, out, num_gpus, reason)
    # The sweep's own reasons too: estimate_time evaluates only the rows left valid.
    timed = tuple(dict.fromkeys((*TIMED_COLUMNS, *time_columns)))
    timing = estimate_time(
        space.model,
        grid,
        params=time_params,
        reason=reason,
        columns=timed,
        **_gpu_time_inputs(space, pools),
    )
    if space.max_step_time_s is not None:  # timed first: a slow point keeps its step time
        slow = (reason == 0) & (timing["step_time_s"] > space.max_step_time_s)
        reason = np.where(slow, SLOWER_THAN_MAX, reason).astype(np.int16)
    if space.max_cost_per_million_tokens is not None:  # as the step time: its cost kept
        cost = timing["cost_per_million_tokens"]
        dear = (reason == 0) & (cost > space.max_cost_per_million_tokens)
        reason = np.where(dear, COSTLIER_THAN_MAX, reason).astype(np.int16)
    valid = reason == 0
    fits = out["fits"] & valid
    risk: dict[str, np.ndarray] = {}
    if space.risk is not None:
        risk = _risk_of(space, cols, pools, valid)
        limit = pools.usable_bytes * (1.0 - space.headroom)
        load_fits = out["peak_load_bytes"] <= limit
        fits = valid & load_fits & (risk["oom_probability"] <= space.risk.risk)
    dp = out["dp"]
    bars = _error_bars(space, grid, pools, out)
    return {
        "pool": pool,
        **{a: cols[a] if a in _NAMES else grid[a] for a in AXES[1:]},  # names as codes
        "grad_accum_steps": parallel_layout(grid)["grad_accum_steps"],
        "dp": dp,
        "num_gpus": num_gpus,
        **out,
        "fits": fits,
        "reason": reason,
        **bars,
        **timing,  # NaN where the point is invalid
        **risk,
    }


def _error_bars(
    space: Space, grid: Mapping[str, np.ndarray], pools: _PoolColumns, out: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """Each point's 90% interval of the device peak and its fit_probability against its GPU's
    usable memory less the headroom (report/_error_bars.py; the GPU's alone: the host RAM and
    the searched limits are `fits`' and `reason`'s); none when the peak was not asked for."""
    if "peak_device_bytes" not in out:
        return {}
    return error_bar_columns(
        out["peak_device_bytes"],
        pools.usable_bytes * (1.0 - space.headroom),
        framework=grid["framework"],
        regime=regime_of(lora_rank=grid["lora_rank"], qlora=grid["qlora"]),
    )


def _risk_of(
    space: Space, cols: Mapping[str, np.ndarray], pools: _PoolColumns, valid: np.ndarray
) -> dict[str, np.ndarray]:
    """The risk columns (sweep/_risk.py) of the valid points (NaN elsewhere): one estimate
    over a grid of each valid point at its p50, p99 and worst step lengths and rows (a
    micro-batch of fewer rows keeps the point's gradient accumulation, as estimate's)."""
    assert space.risk is not None
    rows = np.flatnonzero(valid)
    if not len(rows):
        return null_columns(len(valid))
    seq_len = int(space.fixed["seq_len"])
    mb = np.asarray(cols["micro_batch_size"], dtype=np.int64)[rows]
    step_rows, lengths = step_lengths(
        space.risk, micro_batch=mb, cp=np.asarray(cols["cp"])[rows], seq_len=seq_len
    )
    if space.risk.batching == "packed":  # every step alike: one length (seq_len)
        lengths = lengths[:, :1]
    k = lengths.shape[1]
    grid_cols: dict[str, Any] = {
        a: np.repeat(np.asarray(cols[a])[rows], k) for a in AXES if a != "pool"
    }
    grid_cols["seq_len"] = lengths.reshape(-1)
    grid_cols["micro_batch_size"] = np.repeat(step_rows, k)
    gbs = int(space.fixed.get("global_batch_size", 0) or 0)
    if gbs:
        grid_cols["global_batch_size"] = np.repeat(np.maximum(gbs // mb, 1) * step_rows, k)
    grid = make_grid({**space.fixed, **grid_cols})
    at = _pool_columns(space, np.repeat(pools.pool[rows], k))
    out = _estimate_by_overheads(
        space,
        grid,
        at,
        engine_reason=layout_reason(space.model, grid),
        columns={"peak_device_bytes"},
    )
    peaks = np.where(out["reason"] != 0, np.inf, out["peak_device_bytes"]).reshape(-1, k)
    peaks = np.repeat(peaks, 3, axis=1) if k == 1 else peaks  # p50, p99, worst
    limit = pools.usable_bytes[rows] * (1.0 - space.headroom)
    return scatter(risk_columns(space.risk, peaks, limit), rows, len(valid))


class _PoolColumns(NamedTuple):
    """Each point's pool facts as columns (one value per point), and the pools' GPU profiles."""

    pool: np.ndarray
    """The pool index of each point."""
    profiles: list[GpuProfile]
    """The GPU profile of each pool (by pool index)."""
    size: np.ndarray
    """GPUs in the point's pool."""
    per_node: np.ndarray
    """GPUs per node of the point's pool."""
    usable_bytes: np.ndarray
    """Usable memory of the point's GPU, bytes."""


def _pool_columns(space: Space, pool: np.ndarray) -> _PoolColumns:
    """The pool facts of the points on pools `pool` (gathers of per-pool tables)."""
    profiles = [space.gpus[p.gpu] for p in space.fleet.pools]
    return _PoolColumns(
        pool=pool,
        profiles=profiles,
        size=np.array([p.num_gpus for p in space.fleet.pools], dtype=np.int64)[pool],
        per_node=np.array([p.gpus_per_node for p in space.fleet.pools], dtype=np.int64)[pool],
        usable_bytes=np.array([g.usable_bytes for g in profiles], dtype=np.float64)[pool],
    )


def _layout_reasons(
    space: Space,
    grid: Mapping[str, np.ndarray],
    engine_reason: np.ndarray,
    pools: _PoolColumns,
    *,
    num_gpus: np.ndarray,
    tp: np.ndarray,
    pp: np.ndarray,
) -> np.ndarray:
    """Each point's reason code: the engine's layout rule first, else the sweep's own
    (virtual stages without pp, more GPUs than the pool, tp across a node, part of a pool
    with `use_all_gpus`; the later rule wins where several hold)."""
    reason = engine_reason.astype(np.int16)
    own = np.zeros_like(reason)
    own = np.where(pp == 1, np.where(grid["virtual_stages"] > 1, VIRTUAL_WITHOUT_PP, own), own)
    own = np.where(num_gpus > pools.size, EXCEEDS_POOL, own)
    own = np.where(tp > pools.per_node, TP_CROSSES_NODE, own)
    if space.use_all_gpus:
        own = np.where((own == 0) & (num_gpus != pools.size), PART_OF_POOL, own)
    if space.unsupported_pools:
        own = np.where(np.isin(pools.pool, space.unsupported_pools), PRECISION_UNSUPPORTED, own)
    return np.where(reason == 0, own, reason).astype(np.int16)


def _estimate_by_overheads(
    space: Space,
    grid: dict[str, np.ndarray],
    pools: _PoolColumns,
    *,
    engine_reason: np.ndarray,
    columns: Collection[str] | None,
) -> dict[str, np.ndarray]:
    """estimate() of the points, one call per distinct pool overheads (each GPU's cuBLAS
    workspace and CUDA context, `overheads_for`, with the space's `overheads` over them: the
    user's values win over every pool's): usually one call, whose columns are returned as
    they are (no copy); several calls scatter into full-length columns."""
    pool, profiles = pools.pool, pools.profiles
    pool_overheads = [gpu_overheads(g, space.overheads) for g in profiles]
    used = np.flatnonzero(np.bincount(pool, minlength=len(profiles)) > 0)
    distinct = list(dict.fromkeys(pool_overheads[i] for i in used))
    group = np.array([distinct.index(o) if o in distinct else -1 for o in pool_overheads])[pool]
    out: dict[str, np.ndarray] = {}
    for k_group, pool_ov in enumerate(distinct):
        rows = np.arange(len(pool)) if len(distinct) == 1 else np.flatnonzero(group == k_group)
        sub = grid if len(rows) == len(pool) else {k: v[rows] for k, v in grid.items()}
        rl = is_rl(sub)
        part = estimate(
            space.model,
            trainer_grid(sub) if rl else sub,  # DPO: chosen and rejected, twice the sequences
            usable_bytes=pools.usable_bytes[rows],
            headroom=space.headroom,
            overheads=pool_ov,
            columns=None
            if columns is None
            else {
                *columns,
                *("fits", "reason", "dp", "host_bytes", "load_host_bytes"),
                *(RL_STEP_COLUMNS if rl else ()),
            },
            reason=engine_reason if len(rows) == len(pool) else engine_reason[rows],
        )
        if rl:  # an RL point fits when its rollout, score and train phases do
            part = _with_rl_phases(space, sub, part, pools, rows, pool_ov)
        if len(rows) == len(pool):  # one call for every row: its columns as they are
            out = part
            break
        for k, v in part.items():
            if k not in out:
                out[k] = np.empty(len(pool), dtype=np.asarray(v).dtype)
            out[k][rows] = v
    return out


RL_STEP_COLUMNS = (
    "parameters",
    "master_weights",
    "optimizer_states",
    "framework_overhead",
    "peak_device_bytes",
    "headroom_bytes",
)
"""The estimate() columns an RL point's phases are built on (report/_rl.py rl_columns)."""


def _with_rl_phases(
    space: Space,
    sub: dict[str, np.ndarray],
    part: dict[str, np.ndarray],
    pools: _PoolColumns,
    rows: np.ndarray,
    overheads: Overheads,
) -> dict[str, np.ndarray]:
    """estimate()'s columns of RL points with `fits` and `headroom_bytes` judged on the three
    phases (engine/_rl.py), each point on its pool's GPU, and peak_device_bytes the largest
    phase's (the components stay the trainer's step's: they no longer sum to it)."""
    usable = pools.usable_bytes[rows].astype(np.float64)
    phases = rl_columns(
        space.model, sub, part, usable_bytes=usable, headroom=space.headroom, overheads=overheads
    )
    folded = fold_rl(part, phases, sub, limit_bytes=usable * (1.0 - space.headroom))
    if "peak_device_bytes" in part:  # a point's peak is its job's: the largest phase
        rows_rl = np.isfinite(phases["rl_peak_bytes"])
        folded["peak_device_bytes"] = np.where(
            rows_rl, phases["rl_peak_bytes"], part["peak_device_bytes"]
        )
    return folded


def _host_reasons(
    space: Space,
    pools: _PoolColumns,
    out: Mapping[str, np.ndarray],
    num_gpus: np.ndarray,
    reason: np.ndarray,
) -> np.ndarray:
    """`reason` with EXCEEDS_HOST_MEMORY where a valid point's node ranks need more host RAM
    (CPU offload, checkpoint load) than its node has."""
    host_limit = np.array(
        [
            _host_limit_bytes(space, p, g)
            for p, g in zip(space.fleet.pools, pools.profiles, strict=True)
        ]
    )[pools.pool]
    need = node_host_bytes(
        np.maximum(out["host_bytes"], out["load_host_bytes"]),
        ranks_per_node(num_gpus, pools.per_node),
    )
    reason = np.where((reason == 0) & (need > host_limit), EXCEEDS_HOST_MEMORY, reason)
    return reason.astype(np.int16)


def _gpu_time_inputs(space: Space, pools: _PoolColumns) -> dict[str, Any]:
    """estimate_time()'s GPU keywords (time_inputs, the pool's price, gpus_per_node): one
    value for a one-pool fleet, else a column gathered by each point's pool."""
    profiles = pools.profiles
    inputs: dict[str, np.ndarray] = {}
    for i, (p, g) in enumerate(zip(space.fleet.pools, profiles, strict=True)):
        values = time_inputs(g, price_per_hour_usd=p.price_per_gpu_hour(g))
        values["gpus_per_node"] = float(p.gpus_per_node)
        for k, v in values.items():
            inputs.setdefault(k, np.empty(len(profiles)))[i] = v
    return {k: v[0] if len(profiles) == 1 else v[pools.pool] for k, v in inputs.items()}


def rows_on_pools(
    space: Space, rows: Sequence[Mapping[str, Any]]
) -> tuple[list[tuple[int, int]], dict[str, np.ndarray]]:
    """Each row (a point as a table has it: its GPU by name, name-valued axes by name) on each
    pool of its GPU type that can hold it: the (row, pool) pairs and their AXES columns, ready
    for `evaluate_columns` (a table's row does not say which pool of its GPU type it ran on)."""
    pairs = [
        (k, i)
        for k, row in enumerate(rows)
        for i, p in enumerate(space.fleet.pools)
        if p.gpu == row["gpu"] and row["num_gpus"] <= p.num_gpus
    ]
    cols: dict[str, np.ndarray] = {"pool": np.array([i for _, i in pairs], dtype=np.int64)}
    for axis in AXES[1:]:
        values = [rows[k][axis] for k, _ in pairs]
        cols[axis] = np.array(values, dtype=object if axis in _NAMES else np.int64)
    return pairs, cols


def _host_limit_bytes(space: Space, pool: Pool, profile: GpuProfile) -> float:
    """A node's host RAM: the space's override, else the pool's, else the profile's; no
    limit (inf) where none is known."""
    if space.host_memory_bytes is not None:
        return float(space.host_memory_bytes)
    host = pool.host_memory_per_node_bytes(profile)
    return np.inf if host is None else float(host)


def _auto_loss(name: str, value: Any, framework: str) -> bool:
    """`value` is the loss `--loss auto` (the default) resolves to for `framework`: not a
    fixed field of the space (the grid's default resolves the same way)."""
    return name == "loss" and value == resolved_loss(framework, "auto")


def make_space(
    model: ModelSpec,
    fleet: Fleet,
    gpus: Mapping[str, GpuProfile],
    *,
    seq_len: int,
    global_batch_size: int,
    precision: str = "mixed-bf16",
    optimizer: str | Mapping[str, Any] = "adamw",
    framework: str = "megatron",
    max_micro_batch_size: int = 16,
    max_pp: int = 16,
    max_cp: int = 4,
    virtual_stages: tuple[int, ...] = (1, 2),
    headroom: float = 0.10,
    training: Mapping[str, Any] | None = None,
    optimizer_name: str | None = None,
    host_memory_bytes: int | None = None,
    min_gpus: int = 1,
    use_all_gpus: bool = False,
    max_step_time_s: float | None = None,
    max_cost_per_million_tokens: float | None = None,
    allow_long_seq: bool = True,
    risk: SpaceRisk | None = None,
    overheads: Mapping[str, float] | None = None,
) -> Space:
    """The space of a job on a fleet; ValueError on bad input (one line).

    A traced profile (model.profile) fixes precision, recompute and attention to the traced ones
    and tp = cp = 1: the rows it describes.

    `optimizer_name`: the optimizer's name when `optimizer` is a user optimizer's columns.
    `host_memory_bytes`: host RAM of one node for every pool (None: each pool's or profile's).
    `min_gpus`: the fewest GPUs a point takes (the GPU-count axis starts there);
    `use_all_gpus`: a point takes its whole pool (`gpu_counts` keeps the pool sizes; a point
    of a smaller pool's size on a larger pool is invalid, PART_OF_POOL); `max_step_time_s`: a
    slower point is invalid (SLOWER_THAN_MAX), its step time kept; `max_cost_per_million_tokens`:
    a dearer point is invalid (COSTLIER_THAN_MAX), its cost kept. `risk`: a dataset's lengths
    and batching (sweep/_risk.py): a point fits only when its epoch's OOM probability is within
    it.
    slower point is invalid (SLOWER_THAN_MAX), its step time kept. A pool whose GPU cannot
    run the precision has only invalid points (PRECISION_UNSUPPORTED; no pool can: ValueError);
    a sequence beyond the model's positions is a warning (`Space.warnings`), or a ValueError
    for learned positions when `allow_long_seq` is false (the commands' default).
    `overheads`: values over every pool's default overheads (`Space.overheads`, checked
    already: `overhead_overrides`); bytes beyond a pool's GPU memory are a ValueError.
    `training`: other training fields (engine TrainingConfig names). A searched field (AXES)
    given there pins its axis to that value; any other field that differs from its default is
    fixed for every point (a field at its default changes nothing: the space is the one without
    it, and a traced profile keeps its own attention).
    """
    job = _SpaceJob(**locals())  # every parameter, first: the steps below take the job
    _check_sizes(job)
    counts = _gpu_counts(fleet, min_gpus=min_gpus, use_all_gpus=use_all_gpus, training=training)
    axes, fixed = _with_training(job, _job_axes(job, counts), _fixed_fields(job))
    make_grid(fixed)  # validates the fixed fields' names and values
    fixed, unsupported, warnings = _job_sanity(job, fixed)
    return Space(
        model=model,
        fleet=fleet,
        gpus=gpus,
        axes=axes,
        fixed=fixed,
        headroom=headroom,
        labels=_labels(job, axes, fixed),
        host_memory_bytes=host_memory_bytes,
        use_all_gpus=use_all_gpus,
        max_step_time_s=max_step_time_s,
        max_cost_per_million_tokens=max_cost_per_million_tokens,
        unsupported_pools=unsupported,
        warnings=tuple(warnings),
        risk=risk,
        overheads=dict(overheads or {}),
    )


def _job_sanity(
    job: _SpaceJob, fixed: dict[str, Any]
) -> tuple[dict[str, Any], tuple[int, ...], list[str]]:
    """The fixed fields with the precision the fleet runs (runnable_precision: the search's
    default bf16 one on a fleet without bf16 becomes its fp16 counterpart), the pools whose GPU
    cannot run it, and the job's warnings; ValueError (one line) when no pool can run it, for a
    LoRA rank beyond the adapted matrices, or a sequence beyond learned positions without
    `allow_long_seq` (report's checks)."""
    profiles = [job.gpus[p.gpu] for p in job.fleet.pools]
    precision, warnings = runnable_precision(
        str(fixed["precision"]), profiles, default=SEARCH_DEFAULTS["precision"]
    )
    fixed = {**fixed, "precision": precision}
    unsupported = tuple(i for i, g in enumerate(profiles) if precision_reason(precision, g))
    for profile in profiles:
        check_overhead_bytes(dict(job.overheads or {}), profile)
    fields = {**DEFAULTS_BY_FIELD, **(job.training or {}), **fixed}
    check_lora_rank(job.model, int(fields["lora_rank"]), str(fields["lora_targets"]))
    warnings += seq_len_warnings(job.model, int(job.seq_len), allow_long_seq=job.allow_long_seq)
    return fixed, unsupported, warnings


@dataclass(frozen=True, slots=True, kw_only=True)
class _SpaceJob:
    """The arguments of one `make_space` call, so that its steps take one value (built from
    the call's locals: a parameter added there and not here is a TypeError on the first call)."""

    model: ModelSpec
    fleet: Fleet
    gpus: Mapping[str, GpuProfile]
    seq_len: int
    global_batch_size: int
    precision: str
    optimizer: str | Mapping[str, Any]
    framework: str
    max_micro_batch_size: int
    max_pp: int
    max_cp: int
    virtual_stages: tuple[int, ...]
    headroom: float
    training: Mapping[str, Any] | None
    optimizer_name: str | None
    host_memory_bytes: int | None
    min_gpus: int
    use_all_gpus: bool
    max_step_time_s: float | None
    max_cost_per_million_tokens: float | None
    allow_long_seq: bool
    risk: SpaceRisk | None
    overheads: Mapping[str, float] | None


def _check_sizes(job: _SpaceJob) -> None:
    """One ValueError listing every size below 1 (sequence, global batch, micro-batch cap)."""
    errors = []
    if job.seq_len < 1:
        errors.append(f"seq-len must be >= 1, got {job.seq_len}")
    if job.global_batch_size < 1:
        errors.append(f"global-batch-size must be >= 1, got {job.global_batch_size}")
    if job.max_micro_batch_size < 1:
        errors.append(f"max micro-batch size must be >= 1, got {job.max_micro_batch_size}")
    if errors:
        raise ValueError("; ".join(errors))


def _job_axes(job: _SpaceJob, counts: tuple[int, ...]) -> dict[str, tuple[Any, ...]]:
    """The AXES values: the GPU counts, the degrees the model and fleet allow (tp within the
    largest node, pp dividing the layers, cp dividing the sequence, ep dividing the experts),
    the micro-batches; a traced profile only at its own recompute, tp = cp = 1. Every other
    searched field takes its declared values."""
    model, fleet, seq_len = job.model, job.fleet, job.seq_len
    max_per_node = max(p.gpus_per_node for p in fleet.pools)
    layers = model.num_hidden_layers
    pps = [d for d in range(1, min(layers, job.max_pp) + 1) if layers % d == 0]
    eps = [1]
    if model.is_moe:
        eps = [e for e in _powers_of_two(min(model.num_experts, 64)) if model.num_experts % e == 0]
    cps = [c for c in _powers_of_two(job.max_cp) if seq_len % c == 0]
    recomputes = declared_values("recompute")
    traced = model.profile
    if traced is not None:  # a traced profile holds for its own precision and policy only
        recomputes, cps = (traced.recompute,), [1]
    micro_batches = _powers_of_two(min(job.max_micro_batch_size, job.global_batch_size))
    rules: dict[str, tuple[Any, ...]] = {
        "pool": tuple(range(len(fleet.pools))),
        "num_gpus": counts,
        "tp": (1,) if traced is not None else tuple(_powers_of_two(max_per_node)),
        "pp": tuple(pps),
        "virtual_stages": tuple(job.virtual_stages),
        "cp": tuple(cps),
        "ep": tuple(eps),
        "recompute": recomputes,
        "micro_batch_size": tuple(micro_batches),
    }
    rules.update(_rl_axes(job, max_per_node))
    # The axes the job decides (above); every other searched field takes its declared values.
    return {a: rules[a] if a in rules else declared_values(a) for a in AXES}


def _rl_axes(job: _SpaceJob, max_per_node: int) -> dict[str, tuple[Any, ...]]:
    """The RL axes (declared rl_axis) of the job: their defaults alone without --rl; with it,
    the rollout engine's tp over the powers of two within a node that divide the attention
    heads (vLLM's rule; dividing the GPUs is the engine's ROLLOUT_TP_LAYOUT), and for a verl
    job the trainer's offload between phases (verl fsdp_config.param_offload /
    optimizer_offload) and the reference on the GPU or offloaded (ref.fsdp_config.
    param_offload); a LoRA job's reference is its base (shared-lora), a DPO job has no rollout.
    Source: vLLM vllm/config/model.py ModelConfig.verify_with_parallel_config ("Total number of
    attention heads must be divisible by tensor parallel size"); verl b178a3c
    verl/trainer/config/_generated_ppo_trainer.yaml (actor and ref fsdp_config)."""
    fields = {**DEFAULTS_BY_FIELD, **(job.training or {})}
    rl, framework = str(fields["rl"]), str((job.training or {}).get("framework", job.framework))
    out: dict[str, tuple[Any, ...]] = {a: (DEFAULTS_BY_FIELD[a],) for a in RL_AXES}
    if rl == "none":
        return out
    heads = job.model.num_attention_heads
    if rl != "dpo":
        out["rollout_tp"] = tuple(t for t in _powers_of_two(max_per_node) if heads % t == 0)
    verl = framework == "verl"
    if int(fields["lora_rank"]) > 0:
        out["ref_model"] = ("shared-lora",)
    else:
        out["ref_model"] = ("separate", "offloaded") if verl else ("separate",)
    if verl:
        out["rl_trainer_offload"] = declared_values("rl_trainer_offload")
    return out


def _fixed_fields(job: _SpaceJob) -> dict[str, Any]:
    """The grid fields every point shares: the job's (a traced profile's own precision and
    attention), and sequence parallelism, on in every search."""
    optimizer, traced = job.optimizer, job.model.profile
    return {
        "seq_len": job.seq_len,
        "global_batch_size": job.global_batch_size,
        "precision": traced.precision if traced is not None else job.precision,
        # A built-in name, or the grid fields of a user optimizer (engine optimizer_columns).
        **({"optimizer": optimizer} if isinstance(optimizer, str) else dict(optimizer)),
        "framework": job.framework,
        "sequence_parallel": True,
        **({"attention": traced.attention} if traced is not None else {}),
    }


def _with_training(
    job: _SpaceJob, axes: dict[str, tuple[Any, ...]], fixed: dict[str, Any]
) -> tuple[dict[str, tuple[Any, ...]], dict[str, Any]]:
    """The job's other training fields applied: a searched one pins its axis, any other that
    differs from its default (and is not the framework's `--loss auto`) is fixed."""
    axes, fixed = dict(axes), dict(fixed)
    job_framework = str((job.training or {}).get("framework", job.framework))
    for name, value in (job.training or {}).items():
        if name in axes:
            axes[name] = (value,)
        elif value != DEFAULTS_BY_FIELD[name] and not _auto_loss(name, value, job_framework):
            fixed.update(grid_columns({name: value}))
    return axes, fixed


def _labels(
    job: _SpaceJob, axes: Mapping[str, tuple[Any, ...]], fixed: Mapping[str, Any]
) -> dict[str, Any]:
    """The points table's columns of the job's training fields that are not axes: defaults,
    then the fixed fields, then the job's; the loss shown as the one the framework runs, the
    optimizer by name."""
    training, optimizer = job.training or {}, job.optimizer
    labels = {**DEFAULTS_BY_FIELD, **{k: v for k, v in fixed.items() if k in DEFAULTS_BY_FIELD}}
    labels.update({k: v for k, v in training.items() if k not in axes})
    if labels.get("loss") == "auto":  # shown as the loss the framework runs
        labels["loss"] = resolved_loss(str(labels["framework"]), "auto")
    labels["optimizer"] = job.optimizer_name or (
        optimizer if isinstance(optimizer, str) else "custom"
    )
    return {k: v for k, v in labels.items() if k not in axes}


def _gpu_counts(
    fleet: Fleet, *, min_gpus: int, use_all_gpus: bool, training: Mapping[str, Any] | None
) -> tuple[int, ...]:
    """The GPU-count axis: `gpu_counts` from `min_gpus` up (only the pools' sizes with
    `use_all_gpus`); ValueError (one line) when `min_gpus` exceeds every pool or a pinned
    --num-gpus contradicts the constraint."""
    sizes = sorted({p.num_gpus for p in fleet.pools})
    if not 1 <= min_gpus <= sizes[-1]:
        raise ValueError(f"min-gpus: must be 1-{sizes[-1]} (the largest pool), got {min_gpus}")
    pinned = (training or {}).get("num_gpus")
    if pinned is not None and pinned < min_gpus:
        raise ValueError(f"num-gpus: {pinned} is below --min-gpus {min_gpus}")
    if pinned is not None and use_all_gpus and pinned not in sizes:
        allowed = ", ".join(map(str, sizes))
        raise ValueError(f"num-gpus: {pinned} with --use-all-gpus must be a pool's size: {allowed}")
    return tuple(c for c in gpu_counts(fleet) if c >= min_gpus and (not use_all_gpus or c in sizes))


THINNED_AXES = ("num_gpus", "tp", "pp", "cp", "ep", "micro_batch_size")
"""Ordered axes a coarse space keeps every other value of (the first and the last kept)."""
PINNED_AXES = {"virtual_stages": 1}
"""Axes a coarse space pins to one value: a refinement that rarely decides the region."""


def coarse_space(space: Space) -> Space:
    """`space` thinned for a warm start: every other value of each THINNED_AXES axis (the
    first and last kept: one GPU and the whole pool, micro-batch 1 and the largest), one virtual
    stage; pools, ZeRO stages, recompute and offload whole (offload decides which pool fits).
    2-4% of the points (3.9% for Llama-3.1-70B on three pools, 2.4% for Qwen3-30B-A3B).

    Assumes: cost varies smoothly along GPU count, degrees and micro-batch, so the coarse
    optimum lies in the cell of the full one (`zoomed_space` then searches that cell).
    """
    axes = {a: _every_other(v) if a in THINNED_AXES else v for a, v in space.axes.items()}
    for axis, value in PINNED_AXES.items():
        if value in axes[axis]:
            axes[axis] = (value,)
    return replace(space, axes=axes)


def zoomed_space(space: Space, coarse: Space, point: Mapping[str, Any]) -> Space:
    """The cell of `space` around a point of `coarse`: on each thinned layout axis the values
    of `space` between the coarse values either side of the point's; every pool and virtual
    stage (no neighbours to pick among), the coarse micro-batches (a trial enumerates them all
    anyway), the other axes whole: 1-4% of the points in bench/optuna.py's spaces."""
    axes = dict(space.axes)
    for axis in THINNED_AXES:
        if axis == "micro_batch_size":
            axes[axis] = coarse.axes[axis]
        else:
            axes[axis] = _cell(space.axes[axis], coarse.axes[axis], point[axis])
    return replace(space, axes=axes)


def _every_other(values: tuple[Any, ...]) -> tuple[Any, ...]:
    kept = values[::2]
    return kept if kept[-1] == values[-1] else (*kept, values[-1])


def _cell(values: tuple[Any, ...], kept: tuple[Any, ...], value: Any) -> tuple[Any, ...]:
    """The values from the kept value before `value` to the kept value after it."""
    i = kept.index(value)
    lo, hi = values.index(kept[max(i - 1, 0)]), values.index(kept[min(i + 1, len(kept) - 1)])
    return values[lo : hi + 1]


def reason_texts(codes: np.ndarray) -> np.ndarray:
    """The sentence of each reason code (empty for a valid point)."""
    return np.asarray(ALL_REASONS, dtype=object)[np.asarray(codes, dtype=np.int64)]
