"""The `heatmap` command: two knobs on the axes, colour = peak device memory, the fit boundary.

From flags (the `estimate` flags fix every other field; one vectorized engine call for the whole
grid) or from stored points (`--points DIR`, the best point of each cell). The drawing is
trainmem.results.write_heatmap. Bad input raises ValueError (one line, exit code 2) before
anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from trainmem.catalog import load_model, optimizer_columns
from trainmem.engine import (
    KNOBS,
    OPTIMIZERS,
    TYPES,
    ModelSpec,
    bound_reason,
    estimate,
    make_grid,
    parallel_layout,
    reason_text,
    resolved_loss,
)
from trainmem.hardware import GIB, GpuProfile, get_gpu
from trainmem.report import (
    DEFAULT_PRECISIONS,
    check_lora_rank,
    check_precision,
    choice,
    error_bar_columns,
    gpu_overheads,
    overhead_overrides,
    precision_reason,
    regime_of,
    runnable_precision,
)
from trainmem.results import query_points, write_heatmap

from ._axes import SEARCHED

CATEGORICAL: dict[str, tuple[str, ...]] = {
    name: OPTIMIZERS if knob.open_choices else knob.choices
    for name, knob in KNOBS.items()
    if knob.choices is not None or knob.open_choices
}
"""The axes that take names, in their vocabulary's order (built-in optimizers only)."""

AXIS_LABELS = {
    "micro_batch_size": "micro-batch size (sequences per GPU)",
    "seq_len": "sequence length (tokens)",
    "num_gpus": "number of GPUs",
    "tp": "tensor-parallel degree (tp)",
    "pp": "pipeline-parallel degree (pp)",
    "cp": "context-parallel degree (cp)",
    "ep": "expert-parallel degree (ep)",
    "virtual_stages": "virtual pipeline stages per rank",
    "zero": "ZeRO stage (3 = FSDP full shard)",
    "lora_rank": "LoRA rank (0 = full fine-tuning)",
    "recompute": "activation recomputation",
    "offload": "offload to CPU",
    "precision": "precision",
    "optimizer": "optimizer",
    "attention": "attention kernel",
    "framework": "framework",
    "loss": "loss",
    "sequence_parallel": "sequence parallelism",
    "activation_offload": "activation offload",
    "qlora": "QLoRA (NF4 base weights)",
    "dp": "data-parallel degree (dp)",
    "grad_accum_steps": "gradient accumulation steps",
    "global_batch_size": "global batch size (sequences per step)",
}
"""Every axis --x/--y accepts, with its label (units where it has one)."""

FLAG_AXES = tuple(
    k for k in AXIS_LABELS if k not in ("dp", "grad_accum_steps", "global_batch_size")
)
"""Axes from flags: grid fields of make_grid."""
JOB_POINT_COLUMNS = ("seq_len", "precision", "dp", "grad_accum_steps", "global_batch_size")
"""Configuration columns of the points table besides the search axes that a heatmap of stored
points takes: the job's shape (a sweep's flags) and what the layout derives."""
POINT_AXES = (
    *(a for a in AXIS_LABELS if a in SEARCHED or a in JOB_POINT_COLUMNS),
    *(a for a in SEARCHED if a not in AXIS_LABELS),
)
"""Axes from stored points: configuration columns of the points table (every search axis)."""
BOOL_AXES = tuple(a for a in dict.fromkeys((*AXIS_LABELS, *POINT_AXES)) if TYPES.get(a) is bool)
"""The switches among the axes (values on / off)."""
MAX_AXIS_VALUES = 64
DERIVED_LOWEST = {"dp": 1, "grad_accum_steps": 1}
"""The least value of the stored axes that are no training field (derived: at least 1)."""


def axis_label(axis: str) -> str:
    """An axis's label on the picture (a search axis without one in AXIS_LABELS: its name)."""
    return AXIS_LABELS.get(axis, axis.replace("_", " "))


def _powers(first: int, count: int) -> list[int]:
    return [first << k for k in range(count)]


def default_values(axis: str, config: dict[str, Any]) -> list[Any]:
    """The values an axis takes when --x-values / --y-values is not given."""
    if axis == "num_gpus":  # multiples of the model-parallel group, up to 64 of them
        return _powers(max(config["tp"] * config["pp"] * config["cp"], 1), 7)
    if axis in CATEGORICAL:
        return list(CATEGORICAL[axis])
    if axis in BOOL_AXES:
        return [False, True]
    table: dict[str, list[int]] = {
        "micro_batch_size": _powers(1, 7),  # 1 .. 64
        "seq_len": _powers(512, 7),  # 512 .. 32,768
        "tp": _powers(1, 4),
        "pp": _powers(1, 4),
        "cp": _powers(1, 4),
        "ep": _powers(1, 4),
        "virtual_stages": [1, 2, 4],
        "zero": [0, 1, 2, 3],
        "lora_rank": [0, 8, 16, 32, 64, 128],
    }
    return table[axis]


def parse_values(flag: str, axis: str, text: str) -> list[Any]:
    """A comma list of axis values: whole numbers, names of the axis's choices, or on/off.

    Each value is judged as its field's own flag would judge it (its choices, its bounds:
    micro-batch, sequence length and parallel degrees >= 1, ...): a bad value is a
    ValueError naming `flag` and the value, before any cell is computed or drawn (a column of
    micro-batch -3 is no question anyone asked)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError(f"{flag}: give a comma-separated list of values")
    values: list[Any] = []
    for item in items:
        if axis in CATEGORICAL:
            values.append(choice(flag, item, CATEGORICAL[axis]))
        elif axis in BOOL_AXES:
            values.append(
                choice(flag, item.lower(), ("on", "off", "true", "false")) in ("on", "true")
            )
        else:
            values.append(_whole_number(flag, axis, item))
    if len(set(values)) != len(values):
        raise ValueError(f"{flag}: a value is repeated")
    if len(values) > MAX_AXIS_VALUES:
        raise ValueError(f"{flag}: at most {MAX_AXIS_VALUES} values, got {len(values)}")
    return values


def _whole_number(flag: str, axis: str, item: str) -> int:
    """`item` as a whole number within the axis's bounds (the training field's, as declared
    in engine/_config.py), else a ValueError naming the flag and the value."""
    try:
        value = int(item)
    except ValueError:
        raise ValueError(f"{flag}: '{item}' is not a whole number ({axis})") from None
    knob_ = KNOBS.get(axis)
    if knob_ is not None:
        reason = bound_reason(value, ge=knob_.ge, le=knob_.le)
    else:
        reason = bound_reason(value, ge=DERIVED_LOWEST.get(axis))
    if reason:
        raise ValueError(f"{flag}: {axis} {reason}")
    return value


def check_axes(x: str, y: str, allowed: Sequence[str]) -> None:
    """Both axes known and different; ValueError listing the allowed axes."""
    for flag, axis in (("--x", x), ("--y", y)):
        if axis not in allowed:
            raise ValueError(f"{flag}: unknown axis '{axis}'; allowed: {', '.join(allowed)}")
    if x == y:
        raise ValueError(f"--x and --y are both '{x}'; choose two axes of: {', '.join(allowed)}")


def heatmap_cells(
    spec: ModelSpec,
    profile: GpuProfile,
    config: dict[str, Any],
    *,
    x: str,
    x_values: Sequence[Any],
    y: str,
    y_values: Sequence[Any],
    headroom: float,
    overheads: Mapping[str, float] | None = None,
) -> pl.DataFrame:
    """One row per (x, y) cell, y-major: the axes' values, peak_device_bytes, peak_gib, fits,
    valid, reason (text, empty when valid), headroom_bytes and the error bars
    (peak_device_bytes_low / _high, fit_probability); all cells in one engine call.

    `config` holds every other grid field (scalars); `overheads`: values over the GPU's own
    default overheads (--overhead-file, --overhead: `overhead_overrides`). Each row equals a
    one-row `estimate` of the same configuration (the vectorized call is the single call).
    """
    xs = [v for _ in y_values for v in x_values]  # y-major: x varies fastest
    ys = [v for v in y_values for _ in x_values]
    grid = make_grid({**config, x: xs, y: ys})
    ov = gpu_overheads(profile, overheads or {})
    out = estimate(spec, grid, usable_bytes=profile.usable_bytes, headroom=headroom, overheads=ov)
    valid = out["reason"] == 0
    peak = np.asarray(out["peak_device_bytes"], dtype=np.float64)
    bars = error_bar_columns(
        np.where(valid, peak, np.nan),
        profile.usable_bytes * (1.0 - headroom),
        framework=grid["framework"],
        regime=regime_of(lora_rank=grid["lora_rank"], qlora=grid["qlora"]),
    )
    return pl.DataFrame(
        {
            x: xs,
            y: ys,
            "peak_device_bytes": np.where(valid, np.round(peak), np.nan),
            "peak_gib": np.where(valid, peak / GIB, np.nan),
            "fits": np.asarray(out["fits"], dtype=bool),
            "valid": valid,
            "reason": [reason_text(int(r)) for r in out["reason"]],
            "headroom_bytes": np.where(valid, np.round(out["headroom_bytes"]), np.nan),
            # the error bars (report/_error_bars.py): NaN where the layout is invalid
            **{k: v if k == "fit_probability" else np.round(v) for k, v in bars.items()},
        },
        strict=False,
    )


def best_point_cells(points: pl.DataFrame, *, x: str, y: str, limit_bytes: float) -> pl.DataFrame:
    """The best stored point of each (x, y) cell: the smallest peak among those that fit
    (peak_device_bytes <= limit_bytes and a valid layout), else the smallest valid peak, else an
    invalid one (with its reason). `num_points` counts the cell's points."""
    valid = pl.col("reason").fill_null("") == ""
    ranked = points.with_columns(
        valid.alias("valid"),
        (valid & (pl.col("peak_device_bytes") <= limit_bytes)).alias("fits"),
    ).sort(["fits", "valid", "peak_device_bytes"], descending=[True, True, False], nulls_last=True)
    best = ranked.group_by([x, y], maintain_order=True).agg(
        pl.all().first(), pl.len().alias("num_points")
    )
    return best.with_columns(
        pl.when(pl.col("valid")).then(pl.col("peak_device_bytes")).alias("peak_device_bytes"),
        pl.when(pl.col("valid")).then(pl.col("peak_device_bytes") / GIB).alias("peak_gib"),
        pl.when(pl.col("valid"))
        .then(limit_bytes - pl.col("peak_device_bytes"))
        .alias("headroom_bytes"),
        pl.col("reason").fill_null(""),
    )


def _axis_order(axis: str, column: pl.Series) -> list[Any]:
    """Stored values in axis order: numbers ascending, names in their vocabulary's order."""
    values = column.unique().to_list()
    vocab = CATEGORICAL.get(axis)
    if vocab is not None:
        return sorted(values, key=lambda v: (vocab.index(v) if v in vocab else len(vocab), v))
    return sorted(values)


def _settings(c: dict[str, Any], axes: tuple[str, str]) -> str:
    """The fixed settings of a flags heatmap in words (the axes and idle defaults left out)."""
    dp = int(parallel_layout(c)["dp"])
    adapter = "QLoRA" if c["qlora"] else "LoRA"
    shown = [
        ("seq_len", f"seq {c['seq_len']:,}"),
        ("micro_batch_size", f"micro-batch {c['micro_batch_size']}"),
        ("global_batch_size", c["global_batch_size"] and f"global batch {c['global_batch_size']}"),
        ("precision", c["precision"]),
        ("optimizer", c["optimizer"]),
        ("zero", f"ZeRO {c['zero']}"),
        *((k, f"{k} {c[k]}") for k in ("tp", "pp", "cp")),
        ("dp", not {"num_gpus", "tp", "pp", "cp"} & set(axes) and f"dp {dp}"),
        ("ep", c["ep"] > 1 and f"ep {c['ep']}"),
        ("virtual_stages", c["virtual_stages"] > 1 and f"virtual stages {c['virtual_stages']}"),
        ("recompute", f"recompute {c['recompute']}"),
        ("attention", f"{c['attention']} attention"),
        ("framework", f"framework {c['framework']}"),
        ("loss", f"loss {c['loss']}"),
        ("offload", c["offload"] != "none" and f"offload {c['offload']}"),
        ("lora_rank", c["lora_rank"] > 0 and f"{adapter} rank {c['lora_rank']}"),
        ("sequence_parallel", c["sequence_parallel"] and "sequence parallel"),
        ("activation_offload", c["activation_offload"] and "activation offload"),
    ]
    return "fixed: " + ", ".join(str(t) for k, t in shown if t and k not in axes)


def _points_settings(points: pl.DataFrame, axes: tuple[str, str]) -> str:
    """The points' constant columns in words, and the columns the best point was chosen over."""
    fixed, varying = [], []
    for name in POINT_AXES:
        if name in axes:
            continue
        values = points[name].unique().to_list()
        if len(values) == 1:
            value = values[0]
            fixed.append(f"{name} {value:,}" if isinstance(value, int) else f"{name} {value}")
        else:
            varying.append(name)
    text = ", ".join(fixed)
    if varying:
        text += f"\nbest point per cell (smallest peak that fits) over: {', '.join(varying)}"
    return text


def fitting_x_values(cells: pl.DataFrame, x: str, y: str, y_values: Sequence[Any]) -> dict:
    """For each y value (as text), the x values whose cell fits, in axis order."""
    return {
        str(value): cells.filter((pl.col(y) == value) & pl.col("fits"))[x].to_list()
        for value in y_values
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class Plot:
    """What a heatmap needs besides its source (flags or points)."""

    x: str
    y: str
    x_text: str | None
    """--x-values as given (None: the axis's default range, or the stored values)."""
    y_text: str | None
    out: str
    headroom: float
    hardware_dir: str | None

    def limit_bytes(self, profile: GpuProfile) -> float:
        """Where fitting ends: usable memory x (1 - headroom)."""
        return profile.usable_bytes * (1 - self.headroom)

    def draw(
        self,
        cells: pl.DataFrame,
        xs: list[Any],
        ys: list[Any],
        *,
        profile: GpuProfile,
        title: str,
        subtitle: str,
    ) -> None:
        """Write the image (trainmem.results.write_heatmap) with the axis labels and limit."""
        limit_gib = self.limit_bytes(profile) / GIB
        label = (
            f"fit boundary: {limit_gib:.2f} GiB = {profile.usable_bytes / GIB:.2f} GiB "
            f"usable x (1 - {self.headroom:.0%} headroom)"
        )
        write_heatmap(
            cells,
            self.out,
            x=self.x,
            y=self.y,
            x_values=xs,
            y_values=ys,
            x_label=axis_label(self.x),
            y_label=axis_label(self.y),
            limit_gib=limit_gib,
            limit_label=label,
            title=title,
            subtitle=subtitle,
        )

    def report(
        self,
        cells: pl.DataFrame,
        xs: list[Any],
        ys: list[Any],
        *,
        model: str,
        profile: GpuProfile,
        config: dict[str, Any],
    ) -> dict[str, Any]:
        """The --json object: the file, the GPU limit, the axes and every cell."""
        return {
            "out": self.out,
            "model": model,
            "gpu": {
                "name": profile.name,
                "memory_bytes": profile.memory_bytes,
                "usable_bytes": profile.usable_bytes,
            },
            "headroom": self.headroom,
            "limit_bytes": round(self.limit_bytes(profile)),
            "x": self.x,
            "y": self.y,
            "x_values": xs,
            "y_values": ys,
            "config": config,
            "fitting_x_values": fitting_x_values(cells, self.x, self.y, ys),
            "cells": [{k: _jsonable(v) for k, v in row.items()} for row in cells.to_dicts()],
        }


def from_flags(
    plot: Plot,
    config: dict[str, Any],
    *,
    model: str,
    gpu: str,
    models_dir: str | None,
    optimizers_dir: str | None,
    overhead: list[str] | None = None,
    overhead_file: str | None = None,
) -> dict[str, Any]:
    """Validate, evaluate the grid in one engine call, draw; returns the JSON report.
    `overhead`, `overhead_file`: estimate's, on every cell (checked before anything is drawn)."""
    x, y = plot.x, plot.y
    check_axes(x, y, FLAG_AXES)
    if config.get("loss") == "auto" and not {"loss", "framework"} & {x, y}:
        config = {**config, "loss": resolved_loss(str(config["framework"]), "auto")}  # shown so
    for name, allowed in CATEGORICAL.items():  # every closed vocabulary, as declared
        if name != "optimizer" and name in config:
            choice(name, config[name], allowed)
    optimizer_fields = (
        {} if "optimizer" in (x, y) else optimizer_columns(config["optimizer"], optimizers_dir)
    )
    xs = parse_values("--x-values", x, plot.x_text) if plot.x_text else default_values(x, config)
    ys = parse_values("--y-values", y, plot.y_text) if plot.y_text else default_values(y, config)
    spec = load_model(model, models_dir=models_dir)
    profile = get_gpu(gpu, plot.hardware_dir)
    overrides = overhead_overrides(overhead_file, overhead, profiles=(profile,))
    xs, ys = _runnable(x, xs, profile), _runnable(y, ys, profile)
    if "precision" not in (x, y):  # the default bf16 one on a GPU without bf16: its fp16 one
        precision, _ = runnable_precision(
            str(config["precision"]), [profile], default=DEFAULT_PRECISIONS
        )
        config = {**config, "precision": precision}
    if "lora_rank" not in (x, y) and "lora_targets" not in (x, y):
        check_lora_rank(spec, int(config["lora_rank"]), str(config["lora_targets"]))
    cells = heatmap_cells(
        spec,
        profile,
        {**config, **optimizer_fields},
        x=x,
        x_values=xs,
        y=y,
        y_values=ys,
        headroom=plot.headroom,
        overheads=overrides,
    )
    on = f"{config['num_gpus']} x {profile.name}" if "num_gpus" not in (x, y) else profile.name
    plot.draw(
        cells,
        xs,
        ys,
        profile=profile,
        title=f"Peak memory per GPU: {spec.name} on {on}",
        subtitle=_settings(config, (x, y)),
    )
    fixed = {k: v for k, v in config.items() if k not in (x, y)}
    return plot.report(cells, xs, ys, model=spec.name, profile=profile, config=fixed)


def _runnable(axis: str, values: list[Any], profile: GpuProfile) -> list[Any]:
    """A precision axis's values without those the GPU cannot run (precision_reason: skipped,
    never drawn); ValueError when none is left. Other axes as given."""
    if axis != "precision":
        return values
    kept = [v for v in values if not precision_reason(str(v), profile)]
    if not kept:
        check_precision(str(values[0]), profile)
    return kept


def from_points(plot: Plot, path: str, *, where: str | None) -> dict[str, Any]:
    """Read the points, keep the best per cell, draw; returns the JSON report."""
    x, y = plot.x, plot.y
    check_axes(x, y, POINT_AXES)
    frame = query_points(path, where=where, head=None)
    if frame.height == 0:
        raise ValueError(f"--points: no points under {path!r}" + (" match --where" * bool(where)))
    for column in ("gpu", "model"):
        names = sorted(str(v) for v in frame[column].unique().to_list())
        if len(names) > 1:
            raise ValueError(
                f"--points: points of several values of {column} ({', '.join(names)}); "
                f"keep one with --where \"{column} = '{names[0]}'\""
            )
    profile = get_gpu(str(frame["gpu"][0]), plot.hardware_dir)
    cells = best_point_cells(frame, x=x, y=y, limit_bytes=plot.limit_bytes(profile))
    xs = parse_values("--x-values", x, plot.x_text) if plot.x_text else _axis_order(x, cells[x])
    ys = parse_values("--y-values", y, plot.y_text) if plot.y_text else _axis_order(y, cells[y])
    cells = cells.filter(pl.col(x).is_in(xs) & pl.col(y).is_in(ys)).sort(
        pl.col(y).replace_strict({v: k for k, v in enumerate(ys)}, default=0),
        pl.col(x).replace_strict({v: k for k, v in enumerate(xs)}, default=0),
    )
    if cells.height == 0:
        raise ValueError("--x-values/--y-values: no stored point has these values")
    num_gpus = frame["num_gpus"].unique().to_list()
    on = f"{num_gpus[0]} x {profile.name}" if len(num_gpus) == 1 else profile.name
    model = str(frame["model"][0])
    title = f"Peak memory per GPU: {model} on {on} ({frame.height:,} stored points)"
    plot.draw(cells, xs, ys, profile=profile, title=title, subtitle=_points_settings(frame, (x, y)))
    return plot.report(
        cells, xs, ys, model=model, profile=profile, config={"points": path, "where": where}
    )


def closest_cell_advice(
    report: dict[str, Any],
    training: dict[str, Any],
    *,
    model: str,
    gpu: str,
    headroom: float,
    hardware_dir: str | None,
    models_dir: str | None,
    optimizers_dir: str | None,
    overhead: list[str] | None = None,
    overhead_file: str | None = None,
) -> dict[str, Any]:
    """When no cell of a flags heatmap fits: the valid cell with the smallest peak
    (`closest_cell`) and estimate's advice for it (`advice`: the changes that make it fit);
    {} when some cell fits or none is valid."""
    from trainmem.report import estimate_report

    cells = [c for c in report["cells"] if c["valid"]]
    if not cells or any(c["fits"] for c in report["cells"]):
        return {}
    x, y = report["x"], report["y"]
    cell = min(cells, key=lambda c: c["peak_device_bytes"])
    closest = estimate_report(
        {**training, x: cell[x], y: cell[y]},
        model=model,
        gpu=gpu,
        headroom=headroom,
        hardware_dir=hardware_dir,
        models_dir=models_dir,
        optimizers_dir=optimizers_dir,
        overhead=overhead,
        overhead_file=overhead_file,
    )
    return {
        "closest_cell": {x: cell[x], y: cell[y], "peak_device_bytes": cell["peak_device_bytes"]},
        "advice": closest.get("advice", []),
    }
