"""estimate(): columns in, columns out. Phase-aware peak assembly per rank.

One code path: a single configuration is a grid of one row. No Python loop over rows: model
states and activation terms are evaluated on the distinct combinations of the columns they depend
on (see _factorize.py), the peaks are assembled over whole columns.
"""

from __future__ import annotations

import numpy as np

from ._factorize import per_key
from ._grid import ATTENTION, PRECISIONS, RECOMPUTE, Grid
from ._model import ModelSpec
from ._overhead import Overheads, num_communicators
from ._rank_activations import ACT_KEYS, activation_terms
from ._rank_states import STATE_KEYS, state_terms

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

HF, MEGATRON, DEEPSPEED, TORCHTITAN = 0, 1, 2, 3
ADAMW, ADAMW_FUSED, ADAMW_8BIT, SGD, SGD_MOMENTUM, ADAFACTOR, LION = range(7)
NONE, SELECTIVE, FULL = 0, 1, 2

REASONS = (
    "",
    "micro_batch_size, seq_len, num_gpus, tp, pp, cp and virtual_stages must be >= 1",
    "zero must be 0, 1, 2 or 3",
    "num_gpus must be divisible by tp*pp*cp",
    "num_attention_heads must be divisible by tp",
    "num_key_value_heads and tp must divide one another",
    "num_hidden_layers must be divisible by pp*virtual_stages",
    "seq_len must be divisible by cp",
    "global_batch_size must be divisible by micro_batch_size*dp",
    "ep must divide the number of experts and dp*cp, etp the expert width, ep*etp dp*cp*tp "
    "(and both be 1 for a dense model)",
    "offload needs zero >= 1 (optimizer+params: zero 3)",
    "qlora needs lora_rank > 0",
    "profile: precision, recompute and attention must be the traced ones (valid_for); tp, cp, "
    "ep and etp must be 1; no lora or qlora; loss full",
)
"""Invalid-layout reasons; the `reason` column holds an index into this tuple (0 = valid)."""
PROFILE_MISMATCH = len(REASONS) - 1


def _assemble(
    m: ModelSpec, g: Grid, cols: dict[str, np.ndarray], num_micro: np.ndarray
) -> dict[str, np.ndarray]:
    """Phase peaks (allocated bytes) for the stage each row's `stage_pos` names.

    Everything that depends on the layout only (S) or on the micro-batch shape only (A) comes
    precombined from the per-key passes; what is left per row is a few dozen array operations.
    """
    S = per_key(lambda c: state_terms(m, c), cols, STATE_KEYS)
    A = per_key(lambda c: activation_terms(m, c), cols, ACT_KEYS)
    pp = g["pp"]
    multi = pp > 1

    # Pipeline: 1F1B keeps min(pp - rank, m) micro-batches in flight on rank `stage`;
    # interleaving multiplies the first stage's by 1 + (p - 1)/(p v).
    # Source: Narayanan et al. 2021, Sec. 2.2; Korthikanti et al. 2022, Sec. 4.2.2.
    v = g["virtual_stages"]
    interleave = np.where(v > 1, 1.0 + (pp - 1.0) / (pp * v), 1.0)
    stage = cols["stage_index"]
    in_flight = np.where(
        multi,
        np.minimum(pp - stage, num_micro) * np.where(stage == 0, interleave, 1.0),
        1.0,
    )
    stored = in_flight * A["stage_act"]
    # "Activations" of a pipeline stage: the most alive at any moment of the schedule.
    activations = stored + A["recompute_excess"] + A["activations_autocast_weight_copies"]

    gradients = S["gradients"]
    grads_live = np.where((num_micro > 1) | multi, gradients, 0.0)
    base = S["persistent"] + num_micro * A["pipe_per_micro"] + A["pipe_fixed"]
    live = base + grads_live
    forward_peak = live + stored + S["fsdp_fwd"] + np.maximum(A["fwd_extra"], A["fwd_block_extra"])
    backward_start = live + activations + S["fsdp_fwd"] + A["bwd_start_extra"]
    backward_end = base + S["end_grads"] + stored + A["bwd_end_extra"]
    # The embedding's backward: every other gradient done, its own being written.
    backward_embed = base + gradients + A["embed_extra"]
    backward_recompute = live + activations + A["recompute_extra"]
    backward_peak = np.maximum(
        np.maximum(backward_start, backward_end), np.maximum(backward_embed, backward_recompute)
    )
    optimizer_peak = (
        S["optimizer_peak"] + A["small"] + num_micro * A["pipe_per_micro"] + A["pipe_fixed"]
    )
    fb = np.maximum(forward_peak, backward_peak)
    in_optimizer = optimizer_peak >= fb
    phase = np.where(in_optimizer, 2, (backward_peak >= forward_peak).astype(np.int8))
    peak_allocated = np.maximum(fb, optimizer_peak)
    grads_at_peak = np.where(in_optimizer, gradients, grads_live)
    acts_at_peak = np.where(in_optimizer, 0.0, activations)
    states = S["parameters"] + S["master_weights"] + S["optimizer_states"]
    return {
        "parameters": S["parameters"],
        "master_weights": S["master_weights"],
        "gradients_total": gradients,
        "optimizer_states": S["optimizer_states"],
        "optimizer_step_temporaries": S["optimizer_step_temporaries"],
        "host_bytes": S["host_bytes"] + in_flight * A["activations_offloaded"],
        "activations_total": activations,
        "activations_per_layer": A["activations_per_layer"],
        "activations_outside_layers": A["activations_outside_layers"],
        "activations_autocast_weight_copies": A["activations_autocast_weight_copies"],
        "grads_at_peak": grads_at_peak,
        "acts_at_peak": acts_at_peak,
        "transient": peak_allocated - states - grads_at_peak - acts_at_peak,
        "peak_forward_bytes": forward_peak,
        "peak_backward_bytes": backward_peak,
        "peak_optimizer_step_bytes": optimizer_peak,
        "peak_allocated_bytes": peak_allocated,
        "peak_phase": phase.astype(np.int8),
    }


def layout_reason(m: ModelSpec, g: Grid) -> np.ndarray:
    """Index into REASONS of the first rule each row breaks (0 = valid): masks, not exceptions."""
    tp, pp, cp = g["tp"], g["pp"], g["cp"]
    par = tp * pp * cp
    safe_par = np.maximum(par, 1)
    safe_tp = np.maximum(tp, 1)
    dp = np.maximum(g["num_gpus"] // safe_par, 1)
    gbs = g["global_batch_size"]
    rules = [
        (g["micro_batch_size"] < 1) | (g["seq_len"] < 1) | (g["num_gpus"] < 1) | (tp < 1)
        | (pp < 1) | (cp < 1) | (g["virtual_stages"] < 1),
        (g["zero"] < 0) | (g["zero"] > 3),
        g["num_gpus"] % safe_par != 0,
        m.num_attention_heads % safe_tp != 0,
        (m.num_key_value_heads % safe_tp != 0) & (safe_tp % max(m.num_key_value_heads, 1) != 0),
        m.num_hidden_layers % np.maximum(pp * g["virtual_stages"], 1) != 0,
        g["seq_len"] % np.maximum(cp, 1) != 0,
        (gbs > 0) & (gbs % np.maximum(g["micro_batch_size"] * dp, 1) != 0),
        (g["ep"] < 1)
        | ((g["ep"] > 1) & (not m.is_moe or m.num_experts % np.maximum(g["ep"], 1) != 0))
        | ((dp * cp) % np.maximum(g["ep"], 1) != 0)
        | (g["etp"] < 1)
        | ((g["etp"] > 1)
           & (not m.is_moe or m.moe_intermediate_size % np.maximum(g["etp"], 1) != 0))
        | ((dp * cp * tp) % np.maximum(g["ep"] * g["etp"], 1) != 0)
        | (g["capacity_factor_pct"] < 0),
        ((g["offload"] >= 1) & (g["zero"] < 1)) | ((g["offload"] == 2) & (g["zero"] < 3)),
        g["qlora"] & (g["lora_rank"] < 1),
    ]  # fmt: skip
    reason = np.zeros(len(tp), dtype=np.int8)
    for code in range(len(rules), 0, -1):  # the first broken rule wins
        reason = np.where(rules[code - 1], code, reason).astype(np.int8)
    if m.profile is not None:  # a traced profile: its own rule first
        reason = np.where(profile_mismatch(m, g), PROFILE_MISMATCH, reason).astype(np.int8)
    return reason


def profile_mismatch(m: ModelSpec, g: Grid) -> np.ndarray:
    """Rows a traced profile does not describe: another precision, recompute policy or attention
    than traced, any tensor, context or expert parallelism, LoRA/QLoRA, the chunked loss."""
    p = m.profile
    assert p is not None
    return (
        (g["precision"] != PRECISIONS.index(p.precision))
        | (g["recompute"] != RECOMPUTE.index(p.recompute))
        | (g["attention"] != ATTENTION.index(p.attention))
        | (g["tp"] != 1) | (g["cp"] != 1) | (g["ep"] != 1) | (g["etp"] != 1)
        | (g["lora_rank"] != 0) | g["qlora"] | (g["loss"] != 0)
    )  # fmt: skip


def reason_text(code: int) -> str:
    """The sentence for a `reason` code (empty for a valid layout)."""
    return REASONS[int(code)]


def estimate(
    m: ModelSpec,
    g: Grid,
    *,
    usable_bytes: float | np.ndarray = np.inf,
    headroom: float | np.ndarray = 0.10,
    overheads: Overheads | None = None,
    pp_stage: int | np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Per-device memory of every row of `g` for model `m`.

    By default the worst rank (the pipeline stage with the larger allocated peak, first or last);
    `pp_stage` (0-based, per row or scalar) asks for one stage instead.
    Returns columns (float64 bytes unless said otherwise): the COMPONENTS at the peak (they sum to
    peak_device_bytes), gradients_total and activations_total (persistent gradients; activations
    saved at the end of forward), per-layer details, peak_allocated_bytes / peak_reserved_bytes /
    peak_device_bytes, the phase peaks, peak_phase (0 forward, 1 backward, 2 optimizer_step),
    pp_stage, dp, num_microbatches, fits (bool), headroom_bytes, reason (int8 into REASONS).
    """
    ov = overheads or Overheads()
    reason = layout_reason(m, g)
    tp, pp, cp = g["tp"], g["pp"], g["cp"]
    dp = np.maximum(g["num_gpus"] // np.maximum(tp * pp * cp, 1), 1)
    gbs = np.where(g["global_batch_size"] > 0, g["global_batch_size"], g["micro_batch_size"] * dp)
    num_micro = np.maximum(gbs // np.maximum(g["micro_batch_size"] * dp, 1), 1).astype(np.float64)
    sp = g["sequence_parallel"] & (tp > 1)
    base = {**g, "dp": dp, "sp": sp}

    def stage_pos(stage: np.ndarray) -> np.ndarray:
        return np.where(
            pp <= 1, 0, np.where(stage <= 0, 1, np.where(stage >= pp - 1, 3, 2))
        ).astype(np.int8)

    if pp_stage is not None:
        stage = np.minimum(np.broadcast_to(np.asarray(pp_stage, dtype=np.int64), tp.shape), pp - 1)
        cols = {**base, "stage_pos": stage_pos(stage), "stage_index": stage}
        worst = _assemble(m, g, cols, num_micro)
    else:
        stage = np.zeros(tp.shape, dtype=np.int64)
        worst = _assemble(m, g, {**base, "stage_pos": stage_pos(stage), "stage_index": stage},
                          num_micro)  # fmt: skip
        multi = np.flatnonzero(pp > 1)
        if len(multi):  # the last stage too, on the pipelined rows only
            sub = {k: v[multi] for k, v in base.items()}
            sub["stage_pos"] = np.full(len(multi), 3, dtype=np.int8)
            sub["stage_index"] = pp[multi] - 1
            last = _assemble(m, {k: v[multi] for k, v in g.items()}, sub, num_micro[multi])
            pick = last["peak_allocated_bytes"] > worst["peak_allocated_bytes"][multi]
            rows = multi[pick]
            for k, v in worst.items():
                v = np.array(v, copy=True)
                v[rows] = last[k][pick]
                worst[k] = v
            stage = stage.copy()
            stage[rows] = (pp[rows] - 1).astype(np.int64)

    peak_allocated = worst["peak_allocated_bytes"]
    non_persistent = (
        peak_allocated - worst["parameters"] - worst["master_weights"]
        - worst["optimizer_states"] - worst["grads_at_peak"]
    )  # fmt: skip
    fragmentation = ov.fragmentation_fraction * np.maximum(non_persistent, 0.0)
    peak_reserved = peak_allocated + ov.cublas_workspace_bytes + fragmentation
    outside_torch = ov.cuda_context_bytes + ov.nccl_bytes_per_communicator * num_communicators(
        dp=dp, tp=tp, pp=pp, cp=cp
    )
    peak_device = peak_reserved + outside_torch
    limit = np.asarray(usable_bytes, dtype=np.float64) * (
        1.0 - np.asarray(headroom, dtype=np.float64)
    )
    framework_overhead = outside_torch + ov.cublas_workspace_bytes
    return {
        "parameters": worst["parameters"],
        "master_weights": worst["master_weights"],
        "gradients": worst["grads_at_peak"],
        "optimizer_states": worst["optimizer_states"],
        "activations": worst["acts_at_peak"],
        "transient": worst["transient"],
        "framework_overhead": framework_overhead * np.ones_like(peak_allocated),
        "fragmentation": fragmentation,
        "gradients_total": worst["gradients_total"],
        "activations_total": worst["activations_total"],
        "activations_per_layer": worst["activations_per_layer"],
        "activations_outside_layers": worst["activations_outside_layers"],
        "activations_autocast_weight_copies": worst["activations_autocast_weight_copies"],
        "optimizer_step_temporaries": worst["optimizer_step_temporaries"],
        "host_bytes": worst["host_bytes"],
        "peak_forward_bytes": worst["peak_forward_bytes"],
        "peak_backward_bytes": worst["peak_backward_bytes"],
        "peak_optimizer_step_bytes": worst["peak_optimizer_step_bytes"],
        "peak_allocated_bytes": peak_allocated,
        "peak_reserved_bytes": peak_reserved,
        "peak_device_bytes": peak_device,
        "peak_phase": worst["peak_phase"],
        "pp_stage": stage,
        "dp": dp,
        "num_microbatches": num_micro,
        "fits": (peak_device <= limit) & (reason == 0),
        "headroom_bytes": limit - peak_device,
        "reason": reason,
    }
