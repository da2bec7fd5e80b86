"""Draw the step's allocated memory over time (report/_timeline.py's moments) as stacked bars,
and write the memory snapshot pickle: `trainmem estimate --plot` / `--memory-viz`.

One bar per moment of the worst rank's step (forward block by block, the loss, the backward
block by block with its recompute moment, the optimizer step, the step's end), its components
stacked (parameters, master weights, optimizer states, gradients, activations, transient), in
GiB (2**30 bytes). The GPU's usable memory and the fit limit (usable less the headroom) are
lines; so is the allocated memory at which the device would reach the fit limit (the limit
less what the device holds outside the allocated bytes at the peak: CUDA context, NCCL,
cuBLAS workspace, fragmentation). The step's peak is marked. Written atomically as the heatmap
is (results/_plot.py), PNG or SVG by extension.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

GIB = float(2**30)

COLOURS = {
    "parameters": "#1f4e79",
    "master_weights": "#5b8db8",
    "optimizer_states": "#8c6bb1",
    "gradients": "#2e8b57",
    "activations": "#f2a541",
    "transient": "#d1495b",
}
"""One colour per band (TIMELINE_COMPONENTS), bottom to top."""

PHASE_NAMES = {"forward": "forward", "backward": "backward", "optimizer_step": "optimizer\nstep"}

_MISSING_MESSAGE = "--plot needs matplotlib: pip install 'trainmem[plot]'"


def _bands(ax: Any, timeline: Mapping[str, Any], components: tuple[str, ...]) -> None:
    """The stacked bars, one per moment (width 1, no gaps: a step in time)."""
    x = np.arange(len(timeline["moments"]))
    bottom = np.zeros(len(x))
    for k in components:
        gib = np.asarray(timeline[k], dtype=np.float64) / GIB
        if not gib.any():
            continue
        label = k.replace("_", " ")
        ax.bar(x, gib, width=1.0, bottom=bottom, color=COLOURS[k], label=label, linewidth=0)
        bottom += gib


def _phase_spans(ax: Any, phases: list[str], top_gib: float) -> None:
    """Each phase's span: a light background for backward and its name above the bars."""
    start = 0
    for i in range(1, len(phases) + 1):
        if i < len(phases) and phases[i] == phases[start]:
            continue
        if phases[start] == "backward":
            ax.axvspan(start - 0.5, i - 0.5, color="#f3f3f3", zorder=0)
        ax.text(
            (start + i - 1) / 2,
            top_gib,
            PHASE_NAMES[phases[start]],
            ha="center",
            va="bottom",
            fontsize=10,
            color="#333333",
        )
        start = i


def _limits(ax: Any, timeline: Mapping[str, Any]) -> None:
    """The usable memory, the fit limit, and the allocated bytes that reach the fit limit."""
    usable, limit = timeline["usable_bytes"] / GIB, timeline["limit_bytes"] / GIB
    allocated_limit = limit - timeline["outside_allocated_bytes"] / GIB
    ax.axhline(usable, color="black", linewidth=1.4, label=f"usable {usable:.2f} GiB")
    ax.axhline(
        limit, color="black", linewidth=1.2, linestyle="--", label=f"fit limit {limit:.2f} GiB"
    )
    ax.axhline(
        allocated_limit,
        color="#666666",
        linewidth=1.0,
        linestyle=":",
        label=f"allocated at the fit\nlimit {allocated_limit:.2f} GiB",
    )


def _draw(fig: Any, timeline: Mapping[str, Any], components: tuple[str, ...]) -> None:
    """Bars, phase spans, limit lines, the peak's mark, labels and legend on `fig`."""
    total = np.asarray(timeline["total_bytes"], dtype=np.float64) / GIB
    i_peak = int(timeline["peak_moment"])
    top = max(float(total.max()), timeline["usable_bytes"] / GIB) * 1.04
    ax = fig.add_subplot()
    _bands(ax, timeline, components)
    _phase_spans(ax, list(timeline["phases"]), top)
    _limits(ax, timeline)
    ax.annotate(
        f"peak {total[i_peak]:.2f} GiB ({timeline['moments'][i_peak]})",
        xy=(i_peak, total[i_peak]),
        xytext=(0, 18),
        textcoords="offset points",
        ha="center",
        fontsize=10,
        fontweight="bold",
        arrowprops={"arrowstyle": "->", "color": "black"},
    )
    ax.set_xlim(-0.5, len(total) - 0.5)
    ax.set_ylim(0, top * 1.1)
    ax.set_xticks([])
    ax.set_xlabel("the step, moment by moment (one bar per block in forward and backward)")
    ax.set_ylabel("allocated memory per GPU (GiB)")
    ax.spines[["top", "right"]].set_visible(False)
    fig.suptitle("Memory over one training step", fontsize=15, fontweight="bold")
    ax.set_title(timeline["title"], fontsize=10.5, color="#333333")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)


def write_timeline_plot(
    timeline: Mapping[str, Any],
    path: str | os.PathLike[str],
    *,
    components: tuple[str, ...],
    fmt: str,
    size_px: tuple[int, int] = (1200, 640),
    dpi: float = 100.0,
) -> Path:
    """Draw `timeline` (report/_timeline.step_timeline) and write it to `path` atomically as
    `fmt` ("png" or "svg"); returns the path. ValueError without matplotlib (nothing written)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ValueError(_MISSING_MESSAGE) from None
    from ._plot import _save_atomic

    fig = Figure(figsize=(size_px[0] / dpi, size_px[1] / dpi), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    _draw(fig, timeline, components)
    target = Path(path)
    _save_atomic(fig, target, fmt, dpi)
    return target


def write_pickle(value: Any, path: str | os.PathLike[str]) -> Path:
    """Pickle `value` to `path` atomically (a temporary file beside it, fsync, rename), as
    torch.cuda.memory._dump_snapshot writes a snapshot; returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".pickle", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            pickle.dump(value, fh, protocol=4)
            fh.flush()
            os.fsync(fh.fileno())
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
