"""Real-size cells (issue 26): the engine against tests/data/real_size_traces.json, one rank's
traced step on the fake CUDA device at the real widths (tests/data/make_real_size_traces.py).

FSDP2 over 64 ranks with full recompute, Llama-3-70B dims, seq 4096 at micro-batch 1, 2, 4 and
seq 8192 at 1, 2: the
peak is the blocks' backward at the second block from the top (every checkpointed input but the
top one's, one block recomputed with its backward temporaries and FSDP2's unsharded gradients,
the gathered parameters of this block and the prefetched next one, the fp32 reduce-scatter
input of the block before, the root's parameters and head gradient). Tolerance 3% on the peak:
issue 26's bar for held-back fake-device traces; the estimate agrees within 0.5% (what is left:
the few small [T, h] temporaries of a block's backward the engine's working set rounds).
Model states to the byte (1e-6: the same shards as the FSDP2 conformance cells).

Sliding window at seq_len = the window, one GPU, amp-bf16: Mistral-7B (4096), Phi-3-mini
(2047), Gemma-3-1B (512). Activations within 2% (the conformance matrix's threshold; they agree
within 0.4%), the peak within 3% (these peak in the optimizer step).

Only the estimate runs here (a few seconds); the traces are stored.
"""

from __future__ import annotations

import json

import pytest

from tests.real_size_cells import PRESETS, estimate_cell_report, load_traces

DATA = load_traces()
CELLS = {cell["cell"]: cell for cell in DATA["cells"]}
PEAK_TOLERANCE = 0.03
ACTIVATIONS_TOLERANCE = 0.02


def test_the_stored_traces_have_provenance() -> None:
    provenance = DATA["provenance"]
    assert provenance["script"] == "tests/data/make_real_size_traces.py"
    assert provenance["torch"].startswith("2.13")
    assert {"fsdp70b-mb1", "fsdp70b-mb2", "fsdp70b-mb4", "swa-mistral7b"} <= set(CELLS)
    for cell in CELLS.values():
        config = json.loads((PRESETS / f"{cell['flags']['model']}.json").read_text())
        assert cell["measured"]["num_layers"] == config["num_hidden_layers"]  # all layers


@pytest.mark.parametrize("name", sorted(n for n in CELLS if n.startswith("fsdp70b")))
def test_fsdp2_full_recompute_at_real_size(name: str) -> None:
    cell = CELLS[name]
    measured, report = cell["measured"], estimate_cell_report(cell["flags"])
    for key, trace_key in (
        ("parameters", "parameters_bytes"),
        ("gradients", "gradients_bytes"),
        ("optimizer_states", "optimizer_states_bytes"),
    ):
        assert report["bytes"][key] == pytest.approx(measured[trace_key], rel=1e-6), key
    assert report["bytes"]["activations"] == pytest.approx(
        measured["activations_bytes"], rel=ACTIVATIONS_TOLERANCE
    )
    assert measured["peak_phase"] == report["peak_phase"] == "backward"
    assert report["peak_allocated_bytes"] == pytest.approx(
        measured["peak_allocated_bytes"], rel=PEAK_TOLERANCE
    )
    # The blocks' backward peak: two FSDP2 groups unsharded (the root and the block at work)
    # besides the prefetched block's all-gather output; it is the step's peak but where the
    # loss's backward start is higher (micro-batch 4: the fp32 logits' gradient).
    blocks = measured["live_at_blocks_backward_peak_by_category"]
    assert blocks["FSDP groups unsharded (count)"] == 2
    assert blocks["total"] <= measured["peak_allocated_bytes"]


@pytest.mark.parametrize("name", sorted(n for n in CELLS if n.startswith("swa")))
def test_sliding_window_at_its_length(name: str) -> None:
    cell = CELLS[name]
    measured, report = cell["measured"], estimate_cell_report(cell["flags"])
    assert report["bytes"]["activations"] == pytest.approx(
        measured["activations_bytes"], rel=ACTIVATIONS_TOLERANCE
    )
    assert report["peak_allocated_bytes"] == pytest.approx(
        measured["peak_allocated_bytes"], rel=PEAK_TOLERANCE
    )
