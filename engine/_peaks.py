"""The phase peaks of one pipeline stage and the allocator's slack: one definition of the
per-row assembly.

Everything that depends on the layout only or on the micro-batch shape only comes in `T`, the
per-key terms precombined by the state and activation passes (engine/_rank_states.py,
engine/_rank_activations.py); what is left per row is these few dozen operations. numpy runs
them over blocks of rows (engine/_estimate.py); the compiled loop and the single-configuration
path run programs generated from their trace (engine/_fast/_rows.py), so the three agree to
the bit and are edited in one place. numpy only, no Python branch on a row's value.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._pipeline import micro_batches_in_flight

STAGE_PEAKS = (
    "peak_forward_bytes",
    "peak_backward_bytes",
    "peak_optimizer_step_bytes",
    "peak_allocated_bytes",
    "gradients",
    "activations",
    "transient",
    "gradients_total",
    "activations_total",
    "in_flight",
    "peak_phase",
)
"""What stage_peaks returns (gradients / activations: at the peak; `_total`: of the stage)."""

STAGE_COLUMNS = ("pp", "virtual_stages")
"""The grid columns stage_peaks reads per row, besides the per-key terms, the stage and the
micro-batches per step: every path (numpy's blocks, the compiled loop, estimate_one) hands it
exactly these, so a new per-row input of the assembly is one name here. pp comes first (the
compiled loop's skeleton reads it to decide whether the last stage can be the worst rank)."""

PEAK_FORWARD, PEAK_BACKWARD, PEAK_OPTIMIZER_STEP = 0, 1, 2
"""Codes of the `peak_phase` column (index into engine/_estimate.PHASES)."""


def phase_peaks(T: Any, *, pp: Any, v: Any, stage: Any, num_micro: Any) -> dict[str, Any]:
    """Allocated bytes at the forward, backward and optimizer-step peaks of rows on the stage
    `stage` names, and the activations and gradients they hold.

    Peaks are phase-aware: the end of forward (the loss), four moments of backward (its start,
    its end in layer 0, the embedding's backward, a layer's recomputation) and the optimizer
    step; the peak is their max, not a sum of everything. Source: the ground-truth traces
    (tests/data/groundtruth) per phase.
    """
    S = A = T
    multi = pp > 1
    in_flight = micro_batches_in_flight(pp=pp, v=v, stage=stage, num_micro=num_micro, multi=multi)
    stored = in_flight * A["stage_act"]
    # "Activations" of a pipeline stage: the most alive at any moment of the schedule.
    activations = stored + A["recompute_excess"] + A["activations_autocast_weight_copies"]

    gradients = S["gradients"]
    # Gradients alive outside the optimizer step: accumulated over micro-batches, held by a
    # pipeline, or a persistent buffer (Megatron's contiguous grad buffer).
    grads_live = np.where((num_micro > 1) | multi, gradients, S["grads_persistent"])
    # FSDP accumulating unsharded gradients (unsharded_accumulated_gradient_bytes): alive in
    # every phase of a micro-batch after the first, the optimizer step excepted.
    unsharded = np.where(num_micro > 1, S["unsharded_accum_grads"], 0.0)
    grads_live = grads_live + unsharded
    per_micro = num_micro * A["pipe_per_micro"]
    base = S["persistent"] + per_micro + A["pipe_fixed"]
    live = base + grads_live
    forward_peak = live + stored + S["fsdp_fwd"] + A["fwd_max"]
    live_acts = live + activations
    backward_start = live_acts + S["fsdp_bwd_start"] + A["bwd_start_extra"]
    # What an accumulation micro-step keeps to the end of its backward besides (ZeRO-Offload).
    accum = np.where(num_micro > 1, S["accum_end_grads"], 0.0) + unsharded
    backward_end = base + S["end_grads"] + accum + stored + A["bwd_end_extra"]
    # The embedding's backward: every other gradient done, its own being written.
    backward_embed = base + gradients + accum + A["embed_extra"] + S["tied_embedding_grad"]
    # A single stage's top block recomputing: with the gradients of what is above it.
    backward_recompute = live_acts + A["recompute_extra"] + np.where(multi, 0.0, S["top_grads"])
    backward_peak = np.maximum(
        np.maximum(backward_start, backward_end), np.maximum(backward_embed, backward_recompute)
    )
    return {
        "forward": forward_peak,
        "backward": backward_peak,
        "optimizer_step": S["optimizer_peak"]
        + A["small"]
        + A["step_held"]
        + per_micro
        + A["pipe_fixed"],
        "activations": activations,
        "gradients": gradients,
        "grads_live": grads_live,
        "in_flight": in_flight,
    }


def stage_peaks(T: Any, g: Any, *, stage: Any, num_micro: Any) -> dict[str, Any]:
    """The STAGE_PEAKS of rows on one stage: phase_peaks, the step's peak (the largest of the
    three; the optimizer step's on a tie), and what is alive at it (transient: the rest).
    `g`: the rows' STAGE_COLUMNS."""
    pp, v = g["pp"], g["virtual_stages"]
    peaks = phase_peaks(T, pp=pp, v=v, stage=stage, num_micro=num_micro)
    forward_peak, backward_peak = peaks["forward"], peaks["backward"]
    optimizer_peak, activations = peaks["optimizer_step"], peaks["activations"]
    fb = np.maximum(forward_peak, backward_peak)
    in_optimizer = optimizer_peak >= fb
    peak_allocated = np.maximum(fb, optimizer_peak)
    grads_at_peak = np.where(in_optimizer, peaks["gradients"], peaks["grads_live"])
    acts_at_peak = np.where(in_optimizer, 0.0, activations)
    later = (backward_peak >= forward_peak).astype(np.int8)  # PEAK_FORWARD / PEAK_BACKWARD
    return {
        "peak_forward_bytes": forward_peak,
        "peak_backward_bytes": backward_peak,
        "peak_optimizer_step_bytes": optimizer_peak,
        "peak_allocated_bytes": peak_allocated,
        "gradients": grads_at_peak,
        "activations": acts_at_peak,
        "transient": peak_allocated - T["states"] - grads_at_peak - acts_at_peak,
        "gradients_total": peaks["gradients"],
        "activations_total": activations,
        "in_flight": peaks["in_flight"],
        "peak_phase": np.where(in_optimizer, PEAK_OPTIMIZER_STEP, later).astype(np.int8),
    }


def fragmentation_bytes(
    allocated: Any,
    held: tuple[Any, ...],
    largest_block: Any,
    expandable: Any,
    *,
    fraction: Any,
    expandable_fraction: Any,
    largest_block_factor: Any,
) -> Any:
    """Reserved but unused bytes at the peak: a fraction of the non-persistent bytes
    (`allocated` less the states and gradients `held` at the peak, subtracted in turn), smaller
    with expandable segments; and at least about the step's largest tensor with the native
    allocator, which cannot reuse its cached smaller blocks for it.
    Source: engine/_overhead.py (Overheads' fractions)."""
    non_persistent = allocated
    for part in held:
        non_persistent = non_persistent - part
    share = np.where(expandable, expandable_fraction, fraction)
    return np.maximum(
        share * np.maximum(non_persistent, 0.0),
        np.where(expandable, 0.0, largest_block_factor * largest_block),
    )
