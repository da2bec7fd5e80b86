"""estimate(): columns in, columns out. Phase-aware peak assembly per rank.

One code path: a single configuration is a grid of one row. No Python loop over rows; the only
loops run over a model's ~20 parameter-tensor kinds.
"""

from __future__ import annotations

import numpy as np

from . import _activations as act
from . import _states as st
from ._grid import Grid, grid_len
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
"""The per-device breakdown; they sum to peak_device_bytes exactly."""

PHASES = ("forward", "backward", "optimizer_step")

HF, MEGATRON, DEEPSPEED, TORCHTITAN = 0, 1, 2, 3
ADAMW, ADAMW_FUSED, ADAMW_8BIT, SGD, SGD_MOMENTUM, ADAFACTOR, LION = range(7)
NONE, SELECTIVE, FULL = 0, 1, 2

INPUT_BYTES_PER_TOKEN = 8.0
"""input_ids (int64) per token; labels are the same tensor in the ground-truth step."""
BUFFER_BYTES = 1024.0
"""Non-persistent buffers (rotary inv_freq and its original copy), two allocator blocks."""
DEEPSPEED_BUCKET_ELEMS_PER_H2 = 1.0
"""HF Trainer's DeepSpeed "auto" values: reduce_bucket_size = h*h, stage3_prefetch_bucket_size
= 0.9*h*h. Source: transformers/integrations/deepspeed.py (trainer_config_finalize)."""


def _stage(
    m: ModelSpec, g: Grid, *, first: bool, last: bool, dp: np.ndarray, num_micro: np.ndarray
) -> dict[str, np.ndarray]:
    """All components and phase peaks (allocated bytes) of one pipeline stage's rank."""
    prec = g["precision"].astype(np.int64)
    opt = g["optimizer"].astype(np.int64)
    fw = g["framework"].astype(np.int64)
    rc = g["recompute"].astype(np.int64)
    zero = g["zero"]
    tp, pp, cp = g["tp"].astype(np.float64), g["pp"].astype(np.float64), g["cp"]
    sp = g["sequence_parallel"] & (g["tp"] > 1)
    b = g["micro_batch_size"].astype(np.float64)
    s = g["seq_len"].astype(np.float64)
    eager = g["attention"] == 1
    T = b * s / cp  # tokens per rank
    L = m.num_hidden_layers
    num_layers_local = np.ceil(L / pp)

    e = st.COMPUTE_BYTES[prec]
    r = st.RESIDUAL_BYTES[prec]
    amp = st.IS_AMP[prec]
    mixed = st.IS_MIXED[prec]
    fsdp2 = ((fw == HF) | (fw == TORCHTITAN)) & (zero == 3)

    # ---- model states -------------------------------------------------------------------
    full = st.local_param_numel(
        m,
        tp=tp,
        num_layers_local=num_layers_local,
        first_stage=first,
        last_stage=last,
        shard=np.zeros_like(sp),
        dp_shard=np.ones_like(tp),
    )
    shard = st.local_param_numel(
        m,
        tp=tp,
        num_layers_local=num_layers_local,
        first_stage=first,
        last_stage=last,
        shard=np.ones_like(sp),
        dp_shard=dp.astype(np.float64),
    )
    n_full = full["total"]
    tensors_full = full["_tensors"]
    tensors_shard = shard["_tensors"]

    param_e = np.where(mixed & fsdp2, 4.0, st.PARAM_BYTES[prec])
    master_e = np.where(fsdp2, 0.0, st.MASTER_BYTES[prec])
    grad_e = np.where(mixed & (fsdp2 | (fw == MEGATRON)), 4.0, st.GRAD_BYTES[prec])
    state_e = st.STATE_BYTES[prec]

    def bytes_of(elem, sharded):
        a = st.rounded_bytes(tensors_full, elem, num_layers_local)
        bsh = st.rounded_bytes(tensors_shard, elem, num_layers_local)
        return np.where(sharded, bsh, a)

    parameters = bytes_of(param_e, zero >= 3)
    master = bytes_of(master_e, zero >= 1)
    gradients = bytes_of(grad_e, zero >= 2)
    # HF tensor parallel (tp_plan): the embedding's gradient comes out full size on every rank.
    emb_full = m.num_parameters_in("embed")
    hf_tp_embed_extra = np.where(
        (fw == HF) & (tp > 1) & (zero < 2) & first,
        emb_full * grad_e - full["embed"] * grad_e,
        0.0,
    )
    gradients = gradients + hf_tp_embed_extra

    n_state_local = np.where(zero >= 1, shard["total"], n_full)
    state_plain = bytes_of(state_e, zero >= 1)
    optimizer_states = st.NUM_STATES[opt] * state_plain
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
    # foreach temporaries: one state-sized list per (device, dtype) group; HF TP without SP
    # keeps the replicated norms as plain tensors, a separate (smaller) group.
    group_numel = n_state_local - np.where(
        (fw == HF) & (tp > 1) & ~sp & (zero < 1), full["replicated"], 0.0
    )
    step_temp = st.STEP_TEMP_STATES[opt] * state_e * group_numel
    step_temp = np.where(opt == ADAFACTOR, 2.0 * 4.0 * full["max_tensor"], step_temp)
    # Mixed precision without FSDP2: fp32 gradient partition created for the step (DeepSpeed
    # bf16 optimizer `single_partition_of_fp32_groups` grads; Megatron reads main_grad).
    step_temp = step_temp + np.where(mixed & ~fsdp2 & (fw != MEGATRON), 4.0 * n_state_local, 0.0)

    # ---- activations --------------------------------------------------------------------
    loss_tp_div = np.where(fw == MEGATRON, tp, 1.0)
    layer_full = act.hf_layer_bytes(m, T=T, s=s, e=e, r=r, amp=amp, tp=tp, sp=sp, eager=eager)
    core = np.where(
        eager,
        act.hf_attention_bytes(m, T=T, s=s, e=e, tp=tp, eager=True)
        - act.hf_attention_bytes(m, T=T, s=s, e=e, tp=tp, eager=False)
        + e * T * m.q_dim / tp
        + 4.0 * m.num_attention_heads / tp * T,
        e * T * m.q_dim / tp + 4.0 * m.num_attention_heads / tp * T,
    )
    layer_ckpt = act.hf_checkpointed_layer_bytes(m, T=T, r=r, tp=tp, sp=sp)
    layer_hf = np.where(
        rc == FULL, layer_ckpt, np.where(rc == SELECTIVE, layer_full - core, layer_full)
    )
    layer_mg = act.megatron_layer_bytes(m, s=s / cp, b=b, tp=tp, sp=sp, recompute_code=rc)
    layer = np.where(fw == MEGATRON, layer_mg, layer_hf)

    outside = act.hf_outside_bytes(
        m, T=T, s=s, e=e, r=r, amp=amp, tp=tp, sp=sp, loss_tp_div=loss_tp_div
    )
    rope = 2.0 * s * m.head_dim * r if m.rotary else 0.0
    loss_part = 4.0 * T * m.vocab_size / loss_tp_div + 8.0 * T + 1536.0
    if not last:
        outside = np.where(pp > 1, rope, outside)
    elif not first:
        outside = np.where(pp > 1, outside, outside)

    # autocast's cached 16-bit weight copies (amp): every linear weight, alive from its first
    # use in forward to the end of backward; with checkpointing only the head's copy is kept.
    linear_numel_layer = sum(
        p.numel for p in m.param_tensors() if p.group == "layer" and len(p.shape) == 2
    )
    head_numel = m.vocab_size * m.hidden_size
    copies_layers = np.where(amp, 2.0 * linear_numel_layer / tp * num_layers_local, 0.0)
    copies_head = np.where(amp & last, 2.0 * head_numel / tp, 0.0)
    autocast_copies = np.where(rc == FULL, copies_head, copies_layers + copies_head)

    # Pipeline: 1F1B keeps min(pp - rank, m) micro-batches in flight on a stage; interleaving
    # multiplies the first stage's by 1 + (p - 1)/(p v). Source: Narayanan et al. 2021, Sec. 2.2;
    # Korthikanti et al. 2022, Sec. 4.2.2.
    v = g["virtual_stages"].astype(np.float64)
    if first:
        in_flight = np.minimum(pp, num_micro) * np.where(v > 1, 1.0 + (pp - 1) / (pp * v), 1.0)
    else:
        in_flight = np.ones_like(pp)
    in_flight = np.where(pp > 1, in_flight, 1.0)
    stage_act_one = layer * num_layers_local + outside
    recompute_working = np.where((rc == FULL) & (pp > 1), layer_full, 0.0)
    activations = in_flight * stage_act_one + autocast_copies + recompute_working

    # ---- transient buffers ----------------------------------------------------------------
    layer_numel = full["layer"]
    root_numel = full["embed"] + full["final_head"]
    # FSDP2: root unsharded 16-bit copy kept from forward to end of backward (reshard_after_
    # forward=False for the root), one layer's all-gather output (prefetch) in flight.
    fsdp_fwd = np.where(fsdp2 & (dp > 1), 2.0 * root_numel + 2.0 * layer_numel, 0.0)
    # DeepSpeed: bucket and prefetch buffers (HF "auto" sizes), stage-3 live parameters.
    h2 = float(m.hidden_size) ** 2
    ds_buffers = np.where(
        (fw == DEEPSPEED) & (zero >= 1) & (dp > 1),
        2.0 * DEEPSPEED_BUCKET_ELEMS_PER_H2 * h2 * 2.0
        + np.where(zero >= 3, 0.9 * h2 * 2.0 + 2.0 * layer_numel, 0.0),
        0.0,
    )
    # torch.distributed.pipelining allocates one receive buffer per micro-batch.
    pipe_buffers = np.where(
        pp > 1,
        np.where(fw == HF, num_micro, 2.0) * e * T * m.hidden_size / np.where(sp, tp, 1),
        0.0,
    )

    # ---- phase peaks (allocated) ------------------------------------------------------------
    small = BUFFER_BYTES + INPUT_BYTES_PER_TOKEN * T
    persistent = parameters + master + optimizer_states + small + pipe_buffers + ds_buffers
    grads_live = np.where((num_micro > 1) | (pp > 1), gradients, 0.0)
    loss_extra = (
        act.hf_loss_forward_extra_bytes(m, T=T, e=e, r=r, amp=amp, loss_tp_div=loss_tp_div)
        if last
        else 0.0
    )
    amp_ckpt_copies = np.where(amp & (rc == FULL), copies_layers, 0.0)
    forward_peak = persistent + grads_live + activations + loss_extra + amp_ckpt_copies + fsdp_fwd
    loss_grads = 8.0 * T * m.vocab_size / loss_tp_div if last else 0.0
    backward_start = persistent + grads_live + activations + loss_grads + fsdp_fwd

    # End of backward, in layer 0's MLP backward (ground-truth trace): all gradients but the
    # embedding's, layer 0's attention and one MLP matrix; layer 0's activations less three MLP
    # tensors (its own recomputation when checkpointed); seven compute-dtype [T, f] and the
    # residual gradients in flight.
    f_r = m.intermediate_size / tp
    mlp_mats = 3.0 if m.gated_mlp else 2.0
    mlp_numel = sum(
        p.numel
        for p in m.param_tensors()
        if p.group == "layer" and p.name.startswith(("gate", "up", "fc_"))
    )
    mlp_numel_r = mlp_numel / tp
    grad_layer_e = grad_e
    grad_layer_local = np.where(zero >= 2, shard["layer"], layer_numel) * grad_layer_e
    grad_embed_local = np.where(zero >= 2, shard["embed"], full["embed"]) * grad_e
    done_mlp = (
        np.where(zero >= 2, mlp_numel_r / dp, mlp_numel_r) * grad_e * ((mlp_mats - 1.0) / mlp_mats)
    )
    grads_end = gradients - grad_embed_local - grad_layer_local + done_mlp
    grads_end = grads_end - np.where(
        fsdp2 & (dp > 1), grad_layer_local + shard["final_head"] * grad_e, 0.0
    )
    act_end = (
        layer_full
        - (mlp_mats * e * T * f_r if m.gated_mlp else 0.0) * (mlp_mats - 1) / mlp_mats
        + rope
        + np.where(rc == FULL, np.where(r < 4, layer_ckpt, 0.0), 0.0)
    )
    act_end = np.where(pp > 1, act_end + (in_flight - 1.0) * stage_act_one, act_end)
    temp_end = 7.0 * e * T * f_r + (2.0 * r + np.where(amp, 2.0 * e, 0.0)) * T * m.hidden_size
    fsdp_bwd = np.where(
        fsdp2 & (dp > 1),
        2.0 * root_numel + 2.0 * 2.0 * layer_numel + 4.0 * layer_numel + 2.0 * root_numel,
        0.0,
    )
    backward_end = persistent + grads_end + act_end + temp_end + fsdp_bwd
    backward_embed = (
        persistent + gradients + (T * m.hidden_size * r if first else 0.0) + fsdp_bwd * 0.0
    )
    backward_peak = np.maximum(np.maximum(backward_start, backward_end), backward_embed)
    optimizer_peak = (
        parameters + master + gradients + optimizer_states + step_temp + small + pipe_buffers
    )

    peaks = np.stack([forward_peak, backward_peak, optimizer_peak])
    phase = np.argmax(peaks, axis=0)
    peak_allocated = np.max(peaks, axis=0)
    states = parameters + master + optimizer_states
    grads_at_peak = np.choose(phase, [grads_live, grads_live, gradients])
    acts_at_peak = np.where(phase == 2, 0.0, activations)
    transient = peak_allocated - states - grads_at_peak - acts_at_peak
    return {
        "parameters": parameters,
        "master_weights": master,
        "gradients": gradients,
        "optimizer_states": optimizer_states,
        "activations": activations,
        "activations_per_layer": layer,
        "activations_outside_layers": outside,
        "activations_autocast_weight_copies": autocast_copies,
        "optimizer_step_temporaries": step_temp,
        "grads_at_peak": grads_at_peak,
        "acts_at_peak": acts_at_peak,
        "transient": transient,
        "peak_forward": forward_peak,
        "peak_backward": backward_peak,
        "peak_optimizer_step": optimizer_peak,
        "peak_allocated": peak_allocated,
        "peak_phase": phase,
        "_loss_part": np.broadcast_to(loss_part, phase.shape),
    }


def layout_reason(m: ModelSpec, g: Grid) -> np.ndarray:
    """Why a row is invalid ("" when valid): a mask with reasons, not exceptions."""
    n = grid_len(g)
    reason = np.full(n, "", dtype=object)

    def flag(mask: np.ndarray, text: str) -> None:
        reason[(reason == "") & mask] = text

    par = g["tp"] * g["pp"] * g["cp"]
    for field in ("micro_batch_size", "seq_len", "num_gpus", "tp", "pp", "cp", "virtual_stages"):
        flag(g[field] < 1, f"{field} must be >= 1")
    flag((g["zero"] < 0) | (g["zero"] > 3), "zero must be 0, 1, 2 or 3")
    flag(g["num_gpus"] % np.maximum(par, 1) != 0, "num_gpus must be divisible by tp*pp*cp")
    flag(
        m.num_attention_heads % np.maximum(g["tp"], 1) != 0,
        f"num_attention_heads ({m.num_attention_heads}) must be divisible by tp",
    )
    flag(
        (m.num_key_value_heads % np.maximum(g["tp"], 1) != 0)
        & (g["tp"] % np.maximum(m.num_key_value_heads, 1) != 0),
        "num_key_value_heads and tp must divide one another",
    )
    flag(
        m.num_hidden_layers % np.maximum(g["pp"] * g["virtual_stages"], 1) != 0,
        f"num_hidden_layers ({m.num_hidden_layers}) must be divisible by pp*virtual_stages",
    )
    flag(g["seq_len"] % np.maximum(g["cp"], 1) != 0, "seq_len must be divisible by cp")
    dp = np.maximum(g["num_gpus"] // np.maximum(par, 1), 1)
    gbs = g["global_batch_size"]
    flag(
        (gbs > 0) & (gbs % (g["micro_batch_size"] * dp) != 0),
        "global_batch_size must be divisible by micro_batch_size*dp",
    )
    return reason


def estimate(
    m: ModelSpec,
    g: Grid,
    *,
    usable_bytes: float | np.ndarray = np.inf,
    headroom: float | np.ndarray = 0.10,
    overheads: Overheads | None = None,
) -> dict[str, np.ndarray]:
    """Per-device memory of every row of `g` for model `m`: the worst rank's breakdown.

    Returns columns (float64 bytes unless named otherwise): the COMPONENTS (sum exactly to
    peak_device_bytes), peak_allocated_bytes / peak_reserved_bytes / peak_device_bytes,
    peak_phase (0 forward, 1 backward, 2 optimizer_step), phase peaks (allocated), dp,
    fits (bool), headroom_bytes, reason (str; "" when the layout is valid).
    """
    ov = overheads or Overheads()
    reason = layout_reason(m, g)
    par = g["tp"] * g["pp"] * g["cp"]
    dp = np.maximum(g["num_gpus"] // np.maximum(par, 1), 1)
    gbs = np.where(g["global_batch_size"] > 0, g["global_batch_size"], g["micro_batch_size"] * dp)
    num_micro = np.maximum(gbs // np.maximum(g["micro_batch_size"] * dp, 1), 1).astype(np.float64)

    first = _stage(m, g, first=True, last=False, dp=dp, num_micro=num_micro)
    single = g["pp"] == 1
    if np.all(single):
        both = _stage(m, g, first=True, last=True, dp=dp, num_micro=num_micro)
        worst = both
    else:
        both = _stage(m, g, first=True, last=True, dp=dp, num_micro=num_micro)
        last = _stage(m, g, first=False, last=True, dp=dp, num_micro=num_micro)
        pick_last = ~single & (last["peak_allocated"] > first["peak_allocated"])
        worst = {k: np.where(single, both[k], np.where(pick_last, last[k], first[k])) for k in both}

    peak_allocated = worst["peak_allocated"]
    non_persistent = (
        peak_allocated
        - worst["parameters"]
        - worst["master_weights"]
        - worst["optimizer_states"]
        - worst["grads_at_peak"]
    )
    fragmentation = ov.fragmentation_fraction * np.maximum(non_persistent, 0.0)
    workspace = ov.cublas_workspace_bytes
    peak_reserved = peak_allocated + workspace + fragmentation
    comms = num_communicators(dp=dp, tp=g["tp"], pp=g["pp"], cp=g["cp"])
    framework = ov.cuda_context_bytes + ov.nccl_bytes_per_communicator * comms + workspace
    peak_device = peak_reserved + ov.cuda_context_bytes + ov.nccl_bytes_per_communicator * comms
    usable = np.asarray(usable_bytes, dtype=np.float64)
    limit = usable * (1.0 - np.asarray(headroom, dtype=np.float64))
    out = {
        "parameters": worst["parameters"],
        "master_weights": worst["master_weights"],
        "gradients": worst["grads_at_peak"],
        "optimizer_states": worst["optimizer_states"],
        "activations": worst["acts_at_peak"],
        "transient": worst["transient"],
        "framework_overhead": np.broadcast_to(framework, peak_allocated.shape).astype(np.float64),
        "fragmentation": fragmentation,
        "gradients_total": worst["gradients"],
        "activations_total": worst["activations"],
        "activations_per_layer": worst["activations_per_layer"],
        "activations_outside_layers": worst["activations_outside_layers"],
        "activations_autocast_weight_copies": worst["activations_autocast_weight_copies"],
        "optimizer_step_temporaries": worst["optimizer_step_temporaries"],
        "peak_forward_bytes": worst["peak_forward"],
        "peak_backward_bytes": worst["peak_backward"],
        "peak_optimizer_step_bytes": worst["peak_optimizer_step"],
        "peak_allocated_bytes": peak_allocated,
        "peak_reserved_bytes": peak_reserved,
        "peak_device_bytes": peak_device,
        "peak_phase": worst["peak_phase"],
        "dp": dp,
        "num_microbatches": num_micro,
        "fits": (peak_device <= limit) & (reason == ""),
        "headroom_bytes": limit - peak_device,
        "reason": reason,
    }
    return out
