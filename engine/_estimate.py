"""estimate(): columns in, columns out. Phase-aware peak assembly per rank.

One code path: a single configuration is a grid of one row. No Python loop over rows: model
states and activation terms are evaluated on the distinct combinations of the columns they depend
on (see _factorize.py), the peaks are assembled over whole columns.
"""

from __future__ import annotations

import numpy as np

from . import _activations as act
from . import _states as st
from ._factorize import per_key
from ._grid import Grid
from ._model import ModelSpec
from ._overhead import Overheads, num_communicators

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

INPUT_BYTES_PER_TOKEN = 8.0
"""input_ids (int64) per token; the ground-truth step passes the same tensor as labels."""
BUFFER_BYTES = 1024.0
"""Non-persistent buffers (rotary inv_freq and its original copy): two allocator blocks."""
DEEPSPEED_BUCKET_ELEMS_PER_H2 = 1.0
"""HF Trainer's DeepSpeed "auto" values: reduce_bucket_size = h*h, stage3_prefetch_bucket_size
= 0.9*h*h. Source: transformers/integrations/deepspeed.py (trainer_config_finalize)."""
BACKWARD_MLP_TEMP_TF = 7.0
"""Compute-dtype [T, f] gradients in flight at the end-of-backward peak (layer 0's up_proj
backward): read off the ground-truth traces (llama-2-7b, bf16 and amp, T 2048 and 8192: 7 exactly).
"""

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
)
"""Invalid-layout reasons; the `reason` column holds an index into this tuple (0 = valid)."""

STATE_KEYS = ("tp", "pp", "dp", "zero", "precision", "optimizer", "framework", "sp", "stage_pos")
ACT_KEYS = (
    "micro_batch_size",
    "seq_len",
    "cp",
    "tp",
    "pp",
    "sp",
    "precision",
    "attention",
    "recompute",
    "framework",
    "stage_pos",
)


def _flags(c: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) stage flags from stage_pos: 0 only stage, 1 first, 2 middle, 3 last."""
    pos = c["stage_pos"]
    return (pos <= 1), (pos == 0) | (pos == 3)


def _state_terms(m: ModelSpec, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Model states of one rank and the gradient pieces the backward peak needs."""
    prec = c["precision"].astype(np.int64)
    opt = c["optimizer"].astype(np.int64)
    fw = c["framework"].astype(np.int64)
    zero = c["zero"]
    tp = c["tp"].astype(np.float64)
    dp = c["dp"].astype(np.float64)
    sp = c["sp"]
    first, last = _flags(c)
    num_layers_local = np.ceil(m.num_hidden_layers / c["pp"])
    mixed = st.IS_MIXED[prec]
    fsdp2 = ((fw == HF) | (fw == TORCHTITAN)) & (zero == 3)

    full = st.local_param_numel(
        m, tp=tp, num_layers_local=num_layers_local, first_stage=first, last_stage=last,
        shard=np.zeros_like(sp), dp_shard=np.ones_like(tp),
    )  # fmt: skip
    shard = st.local_param_numel(
        m, tp=tp, num_layers_local=num_layers_local, first_stage=first, last_stage=last,
        shard=np.ones_like(sp), dp_shard=dp,
    )  # fmt: skip
    tensors_full, tensors_shard = full["_tensors"], shard["_tensors"]

    # FSDP2 mixed precision keeps fp32 sharded parameters (they are the master copy) and fp32
    # reduced gradients; Megatron keeps an fp32 main-grad buffer.
    param_e = np.where(mixed & fsdp2, 4.0, st.PARAM_BYTES[prec])
    master_e = np.where(fsdp2, 0.0, st.MASTER_BYTES[prec])
    grad_e = np.where(mixed & (fsdp2 | (fw == MEGATRON)), 4.0, st.GRAD_BYTES[prec])
    state_e = st.STATE_BYTES[prec]

    def bytes_of(elem: np.ndarray, sharded: np.ndarray) -> np.ndarray:
        whole = st.rounded_bytes(tensors_full, elem, num_layers_local)
        part = st.rounded_bytes(tensors_shard, elem, num_layers_local)
        return np.where(sharded, part, whole)

    parameters = bytes_of(param_e, zero >= 3)
    master = bytes_of(master_e, zero >= 1)
    gradients = bytes_of(grad_e, zero >= 2)
    # HF tensor parallel (tp_plan): the embedding's gradient comes out full size on every rank.
    gradients = gradients + np.where(
        (fw == HF) & (tp > 1) & (zero < 2) & first,
        (m.num_parameters_in("embed") - full["embed"]) * grad_e,
        0.0,
    )

    n_state_local = np.where(zero >= 1, shard["total"], full["total"])
    optimizer_states = st.NUM_STATES[opt] * bytes_of(state_e, zero >= 1)
    optimizer_states = np.where(
        opt == ADAMW_8BIT,
        np.where(
            zero >= 1,
            st.eight_bit_state_bytes(m, tensors_shard, num_layers_local),
            st.eight_bit_state_bytes(m, tensors_full, num_layers_local),
        ),
        optimizer_states,
    )
    optimizer_states = np.where(
        opt == ADAFACTOR,
        st.adafactor_state_bytes(m, numel_local=n_state_local, num_layers_local=num_layers_local),
        optimizer_states,
    )
    optimizer_states = optimizer_states + np.where(
        opt == ADAMW_FUSED, st.FUSED_STEP_TENSOR_BYTES * full["num_tensors"], 0.0
    )
    # foreach temporaries: one state-sized list per (device, dtype) group, groups in turn. HF TP
    # without SP keeps the replicated norms as plain tensors: a separate, smaller group.
    group_numel = n_state_local - np.where(
        (fw == HF) & (tp > 1) & ~sp & (zero < 1), full["replicated"], 0.0
    )
    step_temp = st.STEP_TEMP_STATES[opt] * state_e * group_numel
    step_temp = np.where(opt == ADAFACTOR, 2.0 * 4.0 * full["max_tensor"], step_temp)
    # Mixed precision outside FSDP2/Megatron: the fp32 gradient partition the optimizer steps on
    # (DeepSpeed BF16_Optimizer / ZeRO `single_partition_of_fp32_groups` grads).
    step_temp = step_temp + np.where(mixed & ~fsdp2 & (fw != MEGATRON), 4.0 * n_state_local, 0.0)

    # Pieces of the end-of-backward peak (layer 0's MLP backward, see _assemble).
    sharded_grads = zero >= 2
    grad_embed = np.where(sharded_grads, shard["embed"], full["embed"]) * grad_e
    grad_layer = np.where(sharded_grads, shard["layer"], full["layer"]) * grad_e
    grad_final_head = np.where(sharded_grads, shard["final_head"], full["final_head"]) * grad_e
    mlp_numel = sum(
        p.numel for p in m.param_tensors()
        if p.group == "layer" and p.name.startswith(("gate", "up", "fc_"))
    )  # fmt: skip
    mlp_mats = 3.0 if m.gated_mlp else 2.0
    grad_mlp_done = (
        mlp_numel / tp / np.where(sharded_grads, dp, 1.0) * grad_e * (mlp_mats - 1.0) / mlp_mats
    )
    # Transient buffers that depend on the layout only.
    layer_numel, root_numel = full["layer"], full["embed"] + full["final_head"]
    fsdp_active = fsdp2 & (dp > 1)
    # FSDP2: the root's unsharded 16-bit copy stays from forward to the end of backward
    # (reshard_after_forward=False for the root); one layer's all-gather output in flight.
    fsdp_fwd = np.where(fsdp_active, 2.0 * root_numel + 2.0 * layer_numel, 0.0)
    # ... and at the end of backward: two layers unsharded (current + prefetch), the fp32
    # reduce-scatter input of one layer, the root's 16-bit gradients before their reduce.
    fsdp_bwd = np.where(
        fsdp_active, 2.0 * root_numel * 2.0 + 2.0 * 2.0 * layer_numel + 4.0 * layer_numel, 0.0
    )
    h2 = float(m.hidden_size) ** 2
    ds_buffers = np.where(
        (fw == DEEPSPEED) & (zero >= 1) & (dp > 1),
        2.0 * DEEPSPEED_BUCKET_ELEMS_PER_H2 * h2 * 2.0
        + np.where(zero >= 3, 0.9 * h2 * 2.0 + 2.0 * layer_numel, 0.0),
        0.0,
    )
    # End of backward: all gradients but the embedding's, layer 0's attention and one MLP
    # matrix (and, under FSDP2, the root's and two layers' not yet reduce-scattered).
    grads_end = gradients - grad_embed - grad_layer + grad_mlp_done
    grads_end = grads_end - np.where(fsdp_active, grad_layer + grad_final_head, 0.0)
    states = parameters + master + optimizer_states
    return {
        "parameters": parameters,
        "master_weights": master,
        "gradients": gradients,
        "optimizer_states": optimizer_states,
        "optimizer_step_temporaries": step_temp,
        "persistent": states + ds_buffers,
        "fsdp_fwd": fsdp_fwd,
        "end_grads": grads_end + fsdp_bwd,
        "optimizer_peak": states + gradients + step_temp,
    }


def _activation_terms(m: ModelSpec, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Activation bytes of one micro-batch on one stage, and the loss/backward transients."""
    prec = c["precision"].astype(np.int64)
    fw = c["framework"].astype(np.int64)
    rc = c["recompute"].astype(np.int64)
    tp = c["tp"].astype(np.float64)
    pp = c["pp"].astype(np.float64)
    sp = c["sp"]
    first, last = _flags(c)
    b = c["micro_batch_size"].astype(np.float64)
    s = c["seq_len"].astype(np.float64)
    eager = c["attention"] == 1
    T = b * s / c["cp"]  # tokens per rank
    h = m.hidden_size
    num_layers_local = np.ceil(m.num_hidden_layers / pp)
    e = st.COMPUTE_BYTES[prec]
    r = st.RESIDUAL_BYTES[prec]
    amp = st.IS_AMP[prec]
    loss_tp_div = np.where(fw == MEGATRON, tp, 1.0)
    sp_div = np.where(sp, tp, 1.0)

    layer_full = act.hf_layer_bytes(m, T=T, s=s, e=e, r=r, amp=amp, tp=tp, sp=sp, eager=eager)
    flash_core = e * T * m.q_dim / tp + 4.0 * m.num_attention_heads / tp * T
    eager_core = (
        act.hf_attention_bytes(m, T=T, s=s, e=e, tp=tp, eager=True)
        - act.hf_attention_bytes(m, T=T, s=s, e=e, tp=tp, eager=False)
        + flash_core
    )
    core = np.where(eager, eager_core, flash_core)
    layer_ckpt = act.hf_checkpointed_layer_bytes(m, T=T, r=r, tp=tp, sp=sp)
    layer_hf = np.where(
        rc == FULL, layer_ckpt, np.where(rc == SELECTIVE, layer_full - core, layer_full)
    )
    layer_mg = act.megatron_layer_bytes(m, s=s / c["cp"], b=b, tp=tp, sp=sp, recompute_code=rc)
    layer = np.where(fw == MEGATRON, layer_mg, layer_hf)
    layer_recomputed = np.where(
        fw == MEGATRON,
        act.megatron_layer_bytes(m, s=s / c["cp"], b=b, tp=tp, sp=sp, recompute_code=NONE),
        layer_full,
    )

    rope = 2.0 * s * m.head_dim * r if m.rotary else 0.0
    outside_all = act.hf_outside_bytes(
        m, T=T, s=s, e=e, r=r, amp=amp, tp=tp, sp=sp, loss_tp_div=loss_tp_div
    )
    # Pipeline stages: the first keeps the embedding side, the last the head and loss; the last
    # stage's output (the 16-bit logits) is held by the schedule until its backward.
    logits_held = np.where(pp > 1, e * T * m.vocab_size / loss_tp_div, 0.0)
    outside = np.where(last, outside_all + logits_held, rope)
    # With checkpointing under torch.distributed.pipelining, a stage keeps L/p - 1 checkpointed
    # inputs per micro-batch (ground truth, first and last stage alike).
    layer_inputs_not_saved = np.where((pp > 1) & (rc == FULL), layer_ckpt, 0.0)
    stage_act = layer * num_layers_local + outside - layer_inputs_not_saved

    # Autocast's cached 16-bit weight copies (amp): every linear weight from its first use in
    # forward to the end of backward; with checkpointing only the head's copy is kept.
    linear_numel_layer = sum(
        p.numel for p in m.param_tensors() if p.group == "layer" and len(p.shape) == 2
    )
    copies_layers = np.where(amp, 2.0 * linear_numel_layer / tp * num_layers_local, 0.0)
    copies_head = np.where(amp & last, 2.0 * m.vocab_size * h / tp, 0.0)
    autocast_copies = np.where(rc == FULL, copies_head, copies_layers + copies_head)

    zero_col = np.zeros_like(T)
    # The forward peak is at the loss; in a pipeline the schedule computes the loss apart (in its
    # backward step), and the last stage's forward peaks just before the head writes the logits
    # (counted in `stage_act`): two [T, h] tensors instead (ground truth, pp rank 3).
    loss_extra = np.where(
        pp > 1,
        2.0 * e * T * h - logits_held,
        act.hf_loss_forward_extra_bytes(m, T=T, e=e, r=r, amp=amp, loss_tp_div=loss_tp_div),
    )
    loss_extra = np.where(last, loss_extra, zero_col)
    # Backward starts with the fp32 gradient of the log-softmax and of the logits (two fp32
    # [T, v] tensors: nll_loss_backward, then _log_softmax_backward_data).
    loss_grads = np.where(last, 8.0 * T * m.vocab_size / loss_tp_div, zero_col)
    loss_grads = loss_grads + np.where(last & (pp > 1), e * T * h / sp_div, 0.0)

    # End of backward, in layer 0's MLP backward (ground-truth traces): layer 0's activations
    # less three [T, f] MLP tensors (its recomputation when checkpointed), the rope tables, the
    # checkpointed 16-bit input; seven [T, f] gradients and the residual gradients in flight.
    f_r = m.intermediate_size / tp
    freed_mlp = (3.0 if m.gated_mlp else 1.0) * e * T * f_r
    act_end = layer_full - freed_mlp + rope + np.where((rc == FULL) & (r < 4), layer_ckpt, 0.0)
    temp_end = BACKWARD_MLP_TEMP_TF * e * T * f_r + (2.0 * r + np.where(amp, 2.0 * e, 0.0)) * T * h
    # Forward working set of a checkpointed layer on a pipeline stage: the trace shows about a
    # full layer's activations less two [T, f] tensors (pp rank 0, 1F1B, 4 in flight).
    fwd_working = np.where((rc == FULL) & ~last, layer_full - 2.0 * e * T * f_r, 0.0)
    # Backward of a recomputed layer on a pipeline stage: the seven [T, f] MLP gradients and one
    # residual gradient (the other arrives in the receive buffer).
    temp_recompute = BACKWARD_MLP_TEMP_TF * e * T * f_r + e * T * h
    multi = pp > 1
    ckpt_multi = (rc == FULL) & multi
    small = BUFFER_BYTES + INPUT_BYTES_PER_TOKEN * T
    # A pipeline schedule splits the whole batch up front: every micro-batch's input ids stay.
    inputs_per_extra_micro = np.where(multi, INPUT_BYTES_PER_TOKEN * T, 0.0)
    amp_ckpt_copies = np.where(amp & (rc == FULL), copies_layers, 0.0)
    # torch.distributed.pipelining allocates one receive buffer per micro-batch; Megatron two.
    pipe_one = np.where(multi, e * T * h / sp_div, 0.0)
    return {
        "activations_per_layer": layer,
        "activations_outside_layers": outside,
        "activations_autocast_weight_copies": autocast_copies,
        "stage_act": stage_act,
        "small": small,
        "fwd_extra": small
        + autocast_copies
        + loss_extra
        + amp_ckpt_copies
        + np.where(multi, fwd_working, 0.0),
        "bwd_start_extra": small + loss_grads,
        "bwd_end_extra": small + act_end + temp_end - stage_act,
        "embed_extra": small + np.where(first, T * h * r, 0.0),
        # A pipeline stage recomputing one layer in backward holds that layer on top of what is
        # stored, the loss tensors being freed by then: the excess over `stored`, if any.
        # Full recompute brings back a whole layer (the framework's own no-recompute layer);
        # selective brings back the attention core of one layer.
        "recompute_excess": np.where(
            multi & (rc != NONE),
            np.maximum(
                np.where(rc == FULL, layer_recomputed, core)
                - np.where(last, outside - rope, zero_col),
                0.0,
            ),
            0.0,
        ),
        "recompute_extra": np.where(ckpt_multi, small + temp_recompute, -np.inf),
        "pipe_per_micro": np.where(fw == HF, pipe_one, 0.0) + inputs_per_extra_micro,
        "pipe_fixed": np.where(fw == HF, 0.0, 2.0 * pipe_one) - inputs_per_extra_micro,
    }


def _assemble(
    m: ModelSpec, g: Grid, cols: dict[str, np.ndarray], num_micro: np.ndarray
) -> dict[str, np.ndarray]:
    """Phase peaks (allocated bytes) for the stage each row's `stage_pos` names.

    Everything that depends on the layout only (S) or on the micro-batch shape only (A) comes
    precombined from the per-key passes; what is left per row is a few dozen array operations.
    """
    S = per_key(lambda c: _state_terms(m, c), cols, STATE_KEYS)
    A = per_key(lambda c: _activation_terms(m, c), cols, ACT_KEYS)
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
    forward_peak = live + stored + S["fsdp_fwd"] + A["fwd_extra"]
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
    ]  # fmt: skip
    reason = np.zeros(len(tp), dtype=np.int8)
    for code in range(len(rules), 0, -1):  # the first broken rule wins
        reason = np.where(rules[code - 1], code, reason).astype(np.int8)
    return reason


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
