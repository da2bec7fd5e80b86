"""Real-size conformance cells (issue 26): the engine against stored traces of real-size jobs.

The conformance matrix's tiny models (bench/conformance.py) cannot show the per-block terms of
a real-size step: at hidden 256 a block's working set, its unsharded gradients and FSDP2's
per-block buffers are negligible against the rest. These cells are traced at the real widths by
tests/data/make_real_size_traces.py (about 1-2 minutes a cell, one fake process group per
process) and stored in tests/data/real_size_traces.json; here only the estimate runs, so the
whole slice takes seconds (tests/golden/test_real_size_traces.py asserts it in CI).

Cells: Llama-3-70B dims under FSDP2 over 64 ranks with full recompute, mixed-bf16, seq 4096 at
micro-batch 1, 2, 4 and seq 8192 at 1, 2; Mistral-7B at seq_len = its sliding window, amp-bf16,
one GPU.

Run: python -m bench.conformance --real-size [--all-rows] [--json FILE]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.real_size_cells import TRACES, estimate_cell_report, load_traces


def real_size_cells(path: Path = TRACES) -> list[dict[str, Any]]:
    """The stored cells: {"cell", "flags", "measured"} each."""
    return list(load_traces(path)["cells"])


def cell_name(cell: dict[str, Any]) -> str:
    f = cell["flags"]
    return (
        f"{f['model']} {f['precision']} rc={f['recompute']} s={f['seq_len']} "
        f"mb={f['micro_batch_size']} fsdp={f['num_gpus']}"
    )


def estimate_cell(flags: dict[str, Any]) -> dict[str, Any]:
    """The formulas' comparable figures for a cell's flags (trace_report's comparison)."""
    from trainmem.trace._report import _estimate_figures

    return _estimate_figures(estimate_cell_report(flags))


def real_size_rows() -> list[dict[str, Any]]:
    """bench.conformance's rows (scored_row) for the stored real-size cells."""
    from bench.conformance import scored_row

    rows = []
    for cell in real_size_cells():
        case = {
            "num_gpus": cell["flags"]["num_gpus"],
            "seq_len": cell["flags"]["seq_len"],
            "micro_batch_size": cell["flags"]["micro_batch_size"],
        }
        rows.append(
            scored_row(
                case,
                cell_name(cell),
                {"measured": cell["measured"]},
                lambda flags=cell["flags"]: estimate_cell(flags),
            )
        )
    return rows
