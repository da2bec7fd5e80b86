"""Draw a fit/no-fit heatmap: two knobs on the axes, colour = peak device memory (GiB).

The input is a table of cells (one row per (x, y) pair: `peak_gib`, `fits`, `valid`); the output
is a PNG or SVG (chosen by the file's extension) written atomically: a temporary file in the same
folder, fsync, os.replace, so a reader never sees half a picture and bad input writes nothing.

Reading it: blue cells fit the GPU (darker = closer to the limit), orange-red cells do not (darker
= further over), a black step line runs between the cells that fit and those that do not, grey
hatched cells are invalid layouts ("n/a"), blank ones have no point ("-").
"""

from __future__ import annotations

import math
import os
import tempfile
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from trainmem.hardware._files import check_path_name

HEATMAP_FORMATS = ("png", "svg")
"""The file types `write_heatmap` writes, chosen by the path's extension."""

MAX_ANNOTATED_CELLS = 16
"""Cells carry their GiB value when neither axis has more values than this."""

_MISSING_MESSAGE = "heatmap needs matplotlib: pip install 'trainmem[plot]'"


def heatmap_format(path: str | os.PathLike[str]) -> str:
    """The file type of `path` ("png" or "svg") from its extension; ValueError otherwise (or
    when the file system could not hold the name)."""
    check_path_name(path, what="--out")
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in HEATMAP_FORMATS:
        allowed = ", ".join(f".{f}" for f in HEATMAP_FORMATS)
        raise ValueError(f"--out: unknown extension of {str(path)!r}; allowed: {allowed}")
    return suffix


def cell_matrices(
    cells: pl.DataFrame,
    *,
    x: str,
    y: str,
    x_values: Sequence[Any],
    y_values: Sequence[Any],
) -> dict[str, np.ndarray]:
    """The cells as [len(y_values), len(x_values)] arrays: peak_gib (NaN where invalid or
    absent), fits, valid and present (a row exists). Row i is y_values[i], column j x_values[j].
    """
    shape = (len(y_values), len(x_values))
    peak = np.full(shape, np.nan)
    fits = np.zeros(shape, dtype=bool)
    valid = np.zeros(shape, dtype=bool)
    present = np.zeros(shape, dtype=bool)
    col = {v: j for j, v in enumerate(x_values)}
    row = {v: i for i, v in enumerate(y_values)}
    for cx, cy, gib, fit, ok in cells.select(x, y, "peak_gib", "fits", "valid").iter_rows():
        if cx not in col or cy not in row:
            continue
        i, j = row[cy], col[cx]
        present[i, j] = True
        valid[i, j] = bool(ok)
        fits[i, j] = bool(fit) and bool(ok)
        peak[i, j] = float(gib) if ok and gib is not None else np.nan
    return {"peak_gib": peak, "fits": fits, "valid": valid, "present": present}


def boundary_segments(
    fits: np.ndarray, valid: np.ndarray
) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """Edges between neighbouring valid cells of which one fits and the other does not.

    In image coordinates: cell (i, j) is centred on (x=j, y=i), so an edge between columns j and
    j + 1 is the vertical segment x = j + 0.5. Invalid cells take no part (no memory boundary).
    """
    segments = []
    num_rows, num_cols = fits.shape
    for i in range(num_rows):
        for j in range(num_cols):
            if not valid[i, j]:
                continue
            if j + 1 < num_cols and valid[i, j + 1] and fits[i, j] != fits[i, j + 1]:
                segments.append(((j + 0.5, i - 0.5), (j + 0.5, i + 0.5)))
            if i + 1 < num_rows and valid[i + 1, j] and fits[i, j] != fits[i + 1, j]:
                segments.append(((j - 0.5, i + 0.5), (j + 0.5, i + 0.5)))
    return segments


def _gib_text(value: float) -> str:
    """A cell's GiB value in at most four significant characters."""
    if value >= 99.95:
        return f"{value:,.0f}"
    return f"{value:.1f}"


def _tick_text(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    return str(value)


def _colormap() -> Any:
    """Blue (fits, light to dark as memory grows) below the limit, orange to dark red above:
    the hue changes exactly at the limit, so fit and no-fit read apart without the legend."""
    from matplotlib import colormaps
    from matplotlib.colors import ListedColormap

    below = colormaps["Blues"](np.linspace(0.2, 0.85, 128))
    above = colormaps["OrRd"](np.linspace(0.3, 0.95, 128))
    return ListedColormap(np.vstack([below, above]), name="trainmem_fit")


def _norm(vmin: float, limit: float, vmax: float) -> Any:
    """Log scale on each side of the limit, the limit at the middle (0.5) of the colour bar."""
    from matplotlib.colors import FuncNorm

    lo, mid, hi = math.log(vmin), math.log(limit), math.log(vmax)

    def forward(v: np.ndarray) -> np.ndarray:
        lv = np.log(np.clip(v, vmin, vmax))
        return np.where(
            lv <= mid, 0.5 * (lv - lo) / (mid - lo), 0.5 + 0.5 * (lv - mid) / (hi - mid)
        )

    def inverse(t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        lv = np.where(t <= 0.5, lo + 2 * t * (mid - lo), mid + (2 * t - 1) * (hi - mid))
        return np.exp(lv)

    return FuncNorm((forward, inverse), vmin=vmin, vmax=vmax)


def _nice_ticks(vmin: float, vmax: float) -> list[float]:
    """1-2-3-5 values between vmin and vmax (GiB), at most about ten."""
    ticks: list[float] = []
    for exponent in range(math.floor(math.log10(vmin)), math.ceil(math.log10(vmax)) + 1):
        ticks.extend(m * 10.0**exponent for m in (1, 2, 3, 5))
    ticks = [t for t in ticks if vmin <= t <= vmax]
    while len(ticks) > 10:
        ticks = ticks[::2]
    return ticks


def _draw(
    fig: Any,
    m: dict[str, np.ndarray],
    *,
    x_values: Sequence[Any],
    y_values: Sequence[Any],
    x_label: str,
    y_label: str,
    limit_gib: float,
    limit_label: str,
    title: str,
    subtitle: str,
) -> None:
    """Draw the heatmap, its boundary, labels and colour bar on `fig`.

    The parts are drawn in this order (cells, axes, boundary, cell labels, colour bar, titles,
    legend): the order decides what lies on top, so the same cells give the same bytes."""
    from matplotlib import patheffects

    peak = m["peak_gib"]
    finite = peak[np.isfinite(peak)]
    vmin = min(float(finite.min()) if finite.size else limit_gib, limit_gib) * 0.9
    vmax = max(float(finite.max()) if finite.size else limit_gib, limit_gib) * 1.1
    cmap, norm = _colormap(), _norm(vmin, limit_gib, vmax)

    ax = fig.add_subplot()
    image = _draw_cells(ax, m, cmap=cmap, norm=norm)
    _draw_axes(ax, x_values=x_values, y_values=y_values, x_label=x_label, y_label=y_label)
    outline = [patheffects.withStroke(linewidth=6, foreground="white")]
    _draw_boundary(ax, m, outline=outline)
    ny, nx = peak.shape
    if max(nx, ny) <= MAX_ANNOTATED_CELLS:
        _annotate(ax, m, cmap=cmap, norm=norm, size=_font_size(nx, ny))
    _draw_colour_bar(fig, ax, image, norm=norm, vmin=vmin, vmax=vmax, limit_gib=limit_gib)

    fig.suptitle(title, fontsize=15, fontweight="bold")
    lines = [textwrap.fill(line, 150) for line in subtitle.splitlines()]
    ax.set_title("\n".join(lines), fontsize=10.5, color="#333333")
    _draw_legend(fig, m, cmap=cmap, limit_label=limit_label, outline=outline)


def _draw_cells(ax: Any, m: dict[str, np.ndarray], *, cmap: Any, norm: Any) -> Any:
    """The coloured cells (NaN peaks left blank) and hatched invalid ones; returns the image
    the colour bar reads."""
    peak, valid, present = m["peak_gib"], m["valid"], m["present"]
    ax.set_facecolor("white")
    image = ax.imshow(
        np.ma.masked_invalid(peak),
        cmap=cmap,
        norm=norm,
        origin="lower",
        aspect="auto",
        interpolation="nearest",
    )
    for i, j in zip(*np.nonzero(present & ~valid), strict=True):
        ax.add_patch(_invalid_patch(j, i))
    return image


def _draw_axes(
    ax: Any, *, x_values: Sequence[Any], y_values: Sequence[Any], x_label: str, y_label: str
) -> None:
    """Ticks at the cell centres, white lines between cells, the axis labels, no frame."""
    nx, ny = len(x_values), len(y_values)
    ax.set_xticks(range(nx), [_tick_text(v) for v in x_values])
    ax.set_yticks(range(ny), [_tick_text(v) for v in y_values])
    ax.set_xticks(np.arange(nx + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(ny + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=1.0)
    ax.tick_params(which="minor", length=0)
    ax.set_xlim(-0.5, nx - 0.5)
    ax.set_ylim(-0.5, ny - 0.5)
    ax.set_xlabel(x_label, fontsize=12)
    ax.set_ylabel(y_label, fontsize=12)
    for side in ax.spines.values():
        side.set_visible(False)


def _draw_boundary(ax: Any, m: dict[str, np.ndarray], *, outline: list[Any]) -> None:
    """The black step line (white-outlined) between the cells that fit and those that do not."""
    from matplotlib.collections import LineCollection

    segments = boundary_segments(m["fits"], m["valid"])
    line = LineCollection(
        segments,
        colors="black",
        linewidths=3.2,
        capstyle="projecting",
        path_effects=outline,
        zorder=4,
    )
    ax.add_collection(line)


def _draw_colour_bar(
    fig: Any, ax: Any, image: Any, *, norm: Any, vmin: float, vmax: float, limit_gib: float
) -> None:
    """The colour bar in GiB with the limit marked; ticks too close to the limit are dropped so
    that their labels do not overlap it."""
    ticks = [t for t in _nice_ticks(vmin, vmax) if abs(float(norm(t)) - 0.5) > 0.05]
    ticks = sorted([*ticks, limit_gib])
    bar = fig.colorbar(image, ax=ax, ticks=ticks, fraction=0.05, pad=0.02)
    bar.ax.set_yticklabels([f"limit {t:.1f}" if t == limit_gib else f"{t:g}" for t in ticks])
    bar.ax.axhline(limit_gib, color="black", linewidth=3)
    bar.set_label("peak device memory per GPU (GiB = 2^30 bytes)", fontsize=11)


def _draw_legend(
    fig: Any, m: dict[str, np.ndarray], *, cmap: Any, limit_label: str, outline: list[Any]
) -> None:
    """The legend under the plot: the limit line (where a boundary is drawn), fits, does not
    fit, and the invalid and missing cells, each only where the picture has some (an all-red
    picture's legend names no fitting cells and no boundary)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    valid, present = m["valid"], m["present"]
    fits = present & valid & m["fits"].astype(bool)
    fails = present & valid & ~m["fits"].astype(bool)
    handles: list[Any] = []
    if len(boundary_segments(m["fits"], m["valid"])):
        handles.append(
            Line2D([], [], color="black", linewidth=3, label=limit_label, path_effects=outline)
        )
    if fits.any():
        handles.append(Patch(facecolor=cmap(0.35), label="fits"))
    if fails.any():
        handles.append(Patch(facecolor=cmap(0.75), label="does not fit (\u2717)"))
    if (present & ~valid).any():
        handles.append(
            Patch(
                facecolor="#d9d9d9", hatch="///", edgecolor="#8c8c8c", label="n/a: invalid layout"
            )
        )
    if (~present).any():
        handles.append(Patch(facecolor="white", edgecolor="#8c8c8c", label="-: no point"))
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=len(handles),
        fontsize=10,
        frameon=False,
        handlelength=2.2,
    )


def _invalid_patch(j: int, i: int) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle(
        (j - 0.5, i - 0.5),
        1,
        1,
        facecolor="#d9d9d9",
        hatch="///",
        edgecolor="#8c8c8c",
        linewidth=0,
        zorder=2,
    )


def _font_size(nx: int, ny: int) -> float:
    """Smaller cell labels for denser grids (11 pt up to 8 x 8, 6 pt at 16 x 16)."""
    return float(np.interp(max(nx, ny), [8, 16], [11, 6]))


def _annotate(ax: Any, m: dict[str, np.ndarray], *, cmap: Any, norm: Any, size: float) -> None:
    """Each cell's GiB value (with a cross when it does not fit), 'n/a' or '-'."""
    peak, fits, valid, present = m["peak_gib"], m["fits"], m["valid"], m["present"]
    for i in range(peak.shape[0]):
        for j in range(peak.shape[1]):
            if not present[i, j]:
                text, colour = "-", "#555555"
            elif not valid[i, j]:
                text, colour = "n/a", "#333333"
            else:
                r, g, b, _ = cmap(norm(peak[i, j]))
                colour = "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.55 else "black"
                text = _gib_text(peak[i, j]) + ("" if fits[i, j] else " \u2717")
            weight = "bold" if present[i, j] and valid[i, j] and fits[i, j] else "normal"
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=size,
                color=colour,
                fontweight=weight,
                zorder=3,
            )


def _save_atomic(fig: Any, path: Path, fmt: str, dpi: float) -> None:
    """Write the figure to a temporary file next to `path`, fsync it, rename it into place."""
    from matplotlib import rc_context

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=f".{fmt}", dir=path.parent)
    # No date or version stamps: the same cells give the same bytes.
    metadata = {"Date": None} if fmt == "svg" else {"Software": None}
    try:
        with os.fdopen(fd, "wb") as fh, rc_context({"svg.hashsalt": "trainmem"}):
            fig.savefig(fh, format=fmt, dpi=dpi, metadata=metadata)
            fh.flush()
            os.fsync(fh.fileno())
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp creates 0600; give the umask's default
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _check_cells(cells: pl.DataFrame, *, x: str, y: str, limit_gib: float) -> None:
    """ValueError before anything is drawn: missing columns, no cells, or a limit that is not a
    positive number of GiB."""
    needed = {x, y, "peak_gib", "fits", "valid"}
    missing = sorted(needed - set(cells.columns))
    if missing:
        raise ValueError(f"heatmap: cells lack column(s) {', '.join(missing)}")
    if cells.height == 0:
        raise ValueError("heatmap: no cells to draw")
    if not (math.isfinite(limit_gib) and limit_gib > 0):
        raise ValueError(f"heatmap: the limit must be a positive number of GiB, got {limit_gib}")


def write_heatmap(
    cells: pl.DataFrame,
    path: str | os.PathLike[str],
    *,
    x: str,
    y: str,
    limit_gib: float,
    title: str,
    subtitle: str = "",
    limit_label: str | None = None,
    x_values: Sequence[Any] | None = None,
    y_values: Sequence[Any] | None = None,
    x_label: str | None = None,
    y_label: str | None = None,
    size_px: tuple[int, int] = (1200, 760),
    dpi: float = 100.0,
) -> Path:
    """Draw `cells` (columns `x`, `y`, `peak_gib`, `fits`, `valid`) as a heatmap and write it to
    `path` (PNG or SVG by extension) atomically; returns the path.

    `limit_gib` is where fitting ends (usable memory x (1 - headroom)); the colour scale turns
    from blue to orange there and a step line separates the cells that fit. Axis values are
    `x_values` / `y_values` in that order (default: as they first appear in `cells`); the y
    axis grows upwards. ValueError on a bad extension, missing columns, no cells, or a missing
    matplotlib (nothing is written then).

    >>> write_heatmap(cells, "heatmap.png", x="micro_batch_size", y="seq_len",
    ...               limit_gib=71.27, title="llama-3.1-8b on 8 x h100-sxm-80gb")  # doctest: +SKIP
    """
    fmt = heatmap_format(path)
    _check_cells(cells, x=x, y=y, limit_gib=limit_gib)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ValueError(_MISSING_MESSAGE) from None
    xs = list(x_values) if x_values is not None else cells[x].unique(maintain_order=True).to_list()
    ys = list(y_values) if y_values is not None else cells[y].unique(maintain_order=True).to_list()
    matrices = cell_matrices(cells, x=x, y=y, x_values=xs, y_values=ys)
    fig = Figure(figsize=(size_px[0] / dpi, size_px[1] / dpi), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    _draw(
        fig,
        matrices,
        x_values=xs,
        y_values=ys,
        x_label=x_label or x,
        y_label=y_label or y,
        limit_gib=limit_gib,
        limit_label=limit_label or f"fit limit {limit_gib:.2f} GiB",
        title=title,
        subtitle=subtitle,
    )
    target = Path(path)
    try:
        _save_atomic(fig, target, fmt, dpi)
    except OSError as error:  # a full or read-only disk, a folder that cannot be made
        raise ValueError(f"out: {os.fspath(path)!r}: {error.strerror or error}") from None
    return target
