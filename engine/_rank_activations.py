"""Activation terms of one micro-batch on one rank, and the loss/backward transients.

Evaluated once per distinct micro-batch shape and layout (see _factorize.per_key). The assembly
only: the formulas are in engine/_activations.py (op by op) and in one module per technique
(_recompute, _loss, _pipeline, _tensor_parallel, _context_parallel, _expert_parallel, _offload,
_lora, _precision).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _activations as act
from ._codes import EAGER, LOSS_CHUNKED, MEGATRON, RECOMPUTE_FULL, RECOMPUTE_NONE
from ._context_parallel import ring_buffer_bytes
from ._expert_parallel import all_to_all_buffer_bytes, routed_rows
from ._lora import lora_activation_delta_bytes, target_bits
from ._loss import loss_forward_extra_bytes, loss_gradient_bytes, outside_layers_bytes
from ._model import ModelSpec
from ._offload import offloaded_activation_bytes
from ._pipeline import block_counts, held_logits_bytes, receive_buffer_bytes, stage_flags
from ._precision import (
    COMPUTE_BYTES,
    IS_AMP,
    PARAM_BYTES,
    RESIDUAL_BYTES,
    autocast_weight_copy_bytes,
)
from ._rank_activation_profile import profile_activation_terms
from ._recompute import attention_core_bytes, recompute_excess_bytes, saved_blocks_bytes
from ._tensor_parallel import loss_tp_divisor, sequence_parallel_divisor

INPUT_BYTES_PER_TOKEN = 8.0
"""input_ids (int64) per token; the ground-truth step passes the same tensor as labels."""
BUFFER_BYTES = 1024.0
"""Non-persistent buffers (rotary inv_freq and its original copy): two allocator blocks."""
BACKWARD_MLP_TEMP_TF = 7.0
"""Compute-dtype [T, f] gradients in flight at the end-of-backward peak (layer 0's up_proj
backward): read off the ground-truth traces (llama-2-7b, bf16 and amp, T 2048 and 8192: 7 exactly).
"""
BACKWARD_MOE_TEMP_SF = 4.0
"""The same for an MoE layer 0, in [S, f_expert] units (S = T x top_k): read off CPU traces of
Mixtral-style models with checkpointing (transformers grouped_mm experts)."""
FORWARD_WORKING_FREED_TF = 2.0
"""[T, f] tensors a checkpointed block's forward has freed at its peak (the traces: about a full
block's activations less two [T, f] tensors; pp rank 0, 1F1B, 4 in flight; CPU MoE traces)."""

ACT_KEYS = (
    "micro_batch_size",
    "seq_len",
    "cp",
    "tp",
    "pp",
    "ep",
    "etp",
    "capacity_factor_pct",
    "sp",
    "precision",
    "attention",
    "recompute",
    "framework",
    "stage_pos",
    "lora_rank",
    "lora_targets",
    "loss",
    "activation_offload",
)


@dataclass(frozen=True, slots=True)
class MicroBatch:
    """The symbols of one micro-batch on one rank (one value per key): T tokens per rank
    (b s / cp), s sequence, b micro-batch, e compute-dtype bytes, r residual-stream bytes."""

    T: np.ndarray
    s: np.ndarray
    b: np.ndarray
    cp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    sp: np.ndarray
    sp_div: np.ndarray
    prec: np.ndarray
    e: np.ndarray
    r: np.ndarray
    amp: np.ndarray
    eager: np.ndarray
    fw: np.ndarray
    rc: np.ndarray
    first: np.ndarray
    last: np.ndarray
    counts: dict[str, np.ndarray]
    loss_tp_div: np.ndarray
    rank: np.ndarray
    lora: np.ndarray
    bits: dict[str, np.ndarray]
    chunked: np.ndarray
    capacity: np.ndarray
    activation_offload: np.ndarray
    zero_col: np.ndarray


def micro_batch(m: ModelSpec, c: dict[str, np.ndarray]) -> MicroBatch:
    """The symbols of the rows `c` (per-key columns), bound once."""
    prec = c["precision"].astype(np.int64)
    fw = c["framework"].astype(np.int64)
    tp = c["tp"].astype(np.float64)
    sp = c["sp"]
    b = c["micro_batch_size"].astype(np.float64)
    s = c["seq_len"].astype(np.float64)
    cp = c["cp"].astype(np.float64)
    T = b * s / cp  # tokens per rank
    first, last = stage_flags(c)
    rank = c["lora_rank"].astype(np.float64)
    return MicroBatch(
        T=T,
        s=s,
        b=b,
        cp=cp,
        tp=tp,
        pp=c["pp"].astype(np.float64),
        ep=c["ep"].astype(np.float64),
        etp=c["etp"].astype(np.float64),
        sp=sp,
        sp_div=sequence_parallel_divisor(sp, tp),
        prec=prec,
        e=COMPUTE_BYTES[prec],
        r=RESIDUAL_BYTES[prec],
        amp=IS_AMP[prec],
        eager=c["attention"] == EAGER,
        fw=fw,
        rc=c["recompute"].astype(np.int64),
        first=first,
        last=last,
        counts=block_counts(m, c),
        loss_tp_div=loss_tp_divisor(fw, tp),
        rank=rank,
        lora=rank > 0,
        bits=target_bits(c["lora_targets"]),
        chunked=c["loss"] == LOSS_CHUNKED,
        capacity=c["capacity_factor_pct"].astype(np.float64) / 100.0,
        activation_offload=c["activation_offload"],
        zero_col=np.zeros_like(T),
    )


def _block_parts(m: ModelSpec, x: MicroBatch, *, moe: bool):
    """(full block bytes, attention core, MLP bytes) for a dense or an MoE block."""
    T, s, e, r, amp, tp, eager = x.T, x.s, x.e, x.r, x.amp, x.tp, x.eager
    if m.is_mla:
        sp_div = np.where(x.sp, tp, 1)
        norms = act.hf_norm_bytes(m, T=T, e=e, r=r, amp=amp, sp_div=sp_div, num_consumers=2)
        attention = act.hf_mla_attention_bytes(m, T=T, e=e, r=r, tp=tp, eager=eager, s=s)
        num_up = 1 + (2 if m.shared_expert_intermediate_size else 0) if moe else 2
        norms = norms + act.hf_norm_bytes(
            m, T=T, e=e, r=r, amp=amp, sp_div=sp_div, num_consumers=num_up
        )
        dense_mlp = act.hf_mlp_bytes(m, T=T, e=e, amp=amp, tp=tp)
        block = norms + attention + dense_mlp
    else:
        block = act.hf_layer_bytes(m, T=T, s=s, e=e, r=r, amp=amp, tp=tp, sp=x.sp, eager=eager)
        dense_mlp = act.hf_mlp_bytes(m, T=T, e=e, amp=amp, tp=tp)
    block = block + act.hf_qk_norm_bytes(m, T=T, r=r, tp=tp)
    mlp = dense_mlp
    if moe:
        e_expert = np.where(amp, 4.0, e)
        mlp = act.hf_moe_bytes(
            m, T=T, e=e, e_expert=e_expert, amp=amp, etp=x.etp, capacity=x.capacity
        )
        block = block - dense_mlp + mlp
    core = attention_core_bytes(m, T=T, s=s, e=e, tp=tp, eager=eager)
    delta = lora_activation_delta_bytes(
        m, T=T, e=e, amp=amp, tp=tp, rank=x.rank, mask=None, adapted_bits=x.bits
    )
    block = np.where(x.lora, block + delta, block)
    return block, core, mlp


def _layers(m: ModelSpec, x: MicroBatch) -> dict[str, np.ndarray]:
    """The blocks of the stage: one layer's bytes (layer 0: dense when the stage holds a dense
    block), its attention core and checkpointed input, the stage's saved bytes under the
    recompute policy (Megatron: Korthikanti et al.), and a recomputed layer's bytes."""
    num_mlp, num_moe, num_layers = x.counts["mlp"], x.counts["moe"], x.counts["layer"]
    dense_block, core, _ = _block_parts(m, x, moe=False)
    moe_block = _block_parts(m, x, moe=True)[0] if m.is_moe else x.zero_col
    layer_full = np.where(num_mlp > 0, dense_block, moe_block)
    layer_ckpt = act.hf_checkpointed_layer_bytes(m, T=x.T, r=x.r, tp=x.tp, sp=x.sp)
    stage_hf = saved_blocks_bytes(
        x.rc,
        blocks=num_mlp * dense_block + num_moe * moe_block,
        core=core,
        checkpointed=layer_ckpt,
        num_layers=num_layers,
    )
    megatron = x.fw == MEGATRON
    shape = {"s": x.s / x.cp, "b": x.b, "tp": x.tp, "sp": x.sp}
    layer_mg = act.megatron_layer_bytes(m, **shape, recompute_code=x.rc)
    stage_layers = np.where(megatron, layer_mg * num_layers, stage_hf)
    layer_mg_none = act.megatron_layer_bytes(m, **shape, recompute_code=RECOMPUTE_NONE)
    return {
        "core": core,
        "layer_full": layer_full,
        "layer_ckpt": layer_ckpt,
        "stage_layers": stage_layers,
        "per_layer": stage_layers / np.maximum(num_layers, 1.0),
        "layer_recomputed": np.where(megatron, layer_mg_none, layer_full),
    }


def _outside(m: ModelSpec, x: MicroBatch, layers: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Saved bytes outside the blocks on this stage, the stage's stored activations and what
    activation offloading moves to the host.

    Pipeline stages: the first keeps the embedding side, the last the head and loss (and the
    held logits); the others the rope tables only. Checkpointed blocks keep their attention_mask
    argument (a sliding-window mask) alive. With checkpointing under
    torch.distributed.pipelining, a stage keeps L/p - 1 checkpointed inputs per micro-batch
    (ground truth, first and last stage alike).
    """
    T, s, e, r, pp, full = x.T, x.s, x.e, x.r, x.pp, x.rc == RECOMPUTE_FULL
    rope = 2.0 * s * (m.qk_rope_head_dim if m.is_mla else m.head_dim) * r if m.rotary else 0.0
    outside_all, chunk_transient = outside_layers_bytes(
        m,
        T=T,
        s=s,
        e=e,
        r=r,
        amp=x.amp,
        tp=x.tp,
        sp=x.sp,
        loss_tp_div=x.loss_tp_div,
        chunked=x.chunked,
        param_e=PARAM_BYTES[x.prec],
        head_trainable=~x.lora,
    )
    logits_held = held_logits_bytes(
        m, T=T, e=e, pp=pp, chunked=x.chunked, loss_tp_div=x.loss_tp_div
    )
    outside = np.where(x.last, outside_all + logits_held, rope)
    ckpt_mask = act.hf_checkpointed_mask_bytes(m, T=T, s=s / x.cp, r=r, eager=x.eager)
    outside = outside + np.where(full & (x.fw != MEGATRON), ckpt_mask, 0.0)
    layer_inputs_not_saved = np.where((pp > 1) & full, layers["layer_ckpt"], 0.0)
    stage_act = layers["stage_layers"] + outside - layer_inputs_not_saved
    offloaded = offloaded_activation_bytes(
        layers["per_layer"], num_layers=x.counts["layer"], enabled=x.activation_offload
    )
    return {
        "rope": rope,
        "outside": outside,
        "logits_held": logits_held,
        "chunk_transient": chunk_transient,
        "stage_act": stage_act - offloaded,
        "offloaded": offloaded,
    }


def _backward_transients(
    m: ModelSpec, x: MicroBatch, layers: dict[str, np.ndarray], rope, routed
) -> dict[str, np.ndarray]:
    """Activations and gradients alive inside a layer's backward or a checkpointed forward.

    End of backward, in layer 0's MLP backward (ground-truth traces): layer 0's activations less
    three [T, f] MLP tensors (its recomputation when checkpointed), the rope tables, the
    checkpointed 16-bit input; seven [T, f] gradients and the residual gradients in flight. An
    MoE layer 0 is read the same way with its `routed` rows (T x top_k) and expert width.
    Forward of a checkpointed block (nothing saved): a full block less FORWARD_WORKING_FREED_TF
    [T, f] tensors. Backward of a recomputed layer on a pipeline stage: the seven [T, f] MLP
    gradients and one residual gradient (the other arrives in the receive buffer).
    """
    T, e, r, amp, h = x.T, x.e, x.r, x.amp, m.hidden_size
    layer_full, full = layers["layer_full"], x.rc == RECOMPUTE_FULL
    is_moe0 = x.counts["mlp"] == 0
    f_r = np.where(is_moe0, m.moe_intermediate_size / x.etp, m.intermediate_size / x.tp)
    rows = np.where(is_moe0, routed, T)
    e_mlp = np.where(is_moe0 & amp, 4.0, e)
    freed_mlp = (3.0 if m.gated_mlp else 1.0) * e_mlp * rows * f_r
    act_end = layer_full - freed_mlp + rope + np.where(full & (r < 4), layers["layer_ckpt"], 0.0)
    temp_factor = np.where(is_moe0, BACKWARD_MOE_TEMP_SF, BACKWARD_MLP_TEMP_TF)
    temp_end = temp_factor * e_mlp * rows * f_r + (2.0 * r + np.where(amp, 2.0 * e, 0.0)) * T * h
    return {
        "act_end": act_end,
        "temp_end": temp_end,
        "fwd_working": np.where(
            full, layer_full - FORWARD_WORKING_FREED_TF * e_mlp * rows * f_r, 0.0
        ),
        "temp_recompute": BACKWARD_MLP_TEMP_TF * e_mlp * rows * f_r + e * T * h,
    }


def _copies_and_loss(
    m: ModelSpec, x: MicroBatch, out: dict[str, np.ndarray], *, full: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Autocast's weight copies (all, and those in the layers), the loss's forward extra and its
    gradients, for the rows of `x` (`out`: _outside's terms)."""
    T, e, pp, last, counts = x.T, x.e, x.pp, x.last, x.counts
    copies, copies_layers = autocast_weight_copy_bytes(
        m,
        amp=x.amp,
        last=last,
        tp=x.tp,
        num_layers=counts["layer"],
        num_mlp=counts["mlp"],
        num_moe=counts["moe"],
        full_recompute=full,
    )
    loss_extra = loss_forward_extra_bytes(
        m,
        T=T,
        e=e,
        r=x.r,
        amp=x.amp,
        pp=pp,
        last=last,
        chunked=x.chunked,
        loss_tp_div=x.loss_tp_div,
        logits_held=out["logits_held"],
        chunk_transient=out["chunk_transient"],
        zero_col=x.zero_col,
    )
    loss_grads = loss_gradient_bytes(
        m,
        T=T,
        e=e,
        pp=pp,
        last=last,
        chunked=x.chunked,
        loss_tp_div=x.loss_tp_div,
        sp_div=x.sp_div,
        zero_col=x.zero_col,
    )
    return copies, copies_layers, loss_extra, loss_grads


def activation_terms(m: ModelSpec, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Activation bytes of one micro-batch on one stage, and the loss/backward transients."""
    if m.profile is not None:
        return profile_activation_terms(m, c)
    x = micro_batch(m, c)
    T, e, pp, last, counts = x.T, x.e, x.pp, x.last, x.counts
    layers = _layers(m, x)
    out = _outside(m, x, layers)
    full, multi = x.rc == RECOMPUTE_FULL, pp > 1
    copies, copies_layers, loss_extra, loss_grads = _copies_and_loss(m, x, out, full=full)
    routed = routed_rows(m, T=T, capacity=x.capacity)
    a2a = all_to_all_buffer_bytes(m, rows=routed, e=e, ep=x.ep, num_moe=counts["moe"])
    cp_fwd, cp_bwd = ring_buffer_bytes(m, T=T, e=e, tp=x.tp, cp=x.cp)
    bwd = _backward_transients(m, x, layers, out["rope"], routed)
    small = BUFFER_BYTES + INPUT_BYTES_PER_TOKEN * T
    # A pipeline schedule splits the whole batch up front: every micro-batch's input ids stay.
    inputs_per_extra_micro = np.where(multi, INPUT_BYTES_PER_TOKEN * T, 0.0)
    amp_ckpt_copies = np.where(x.amp & full, copies_layers, 0.0)
    per_micro, fixed = receive_buffer_bytes(
        np.where(multi, e * T * m.hidden_size / x.sp_div, 0.0), fw=x.fw
    )
    stage_act = out["stage_act"]
    return {
        "activations_per_layer": layers["per_layer"],
        "activations_outside_layers": out["outside"],
        "activations_autocast_weight_copies": copies,
        "activations_offloaded": out["offloaded"],
        "stage_act": stage_act,
        "small": small,
        "fwd_extra": small
        + copies
        + loss_extra
        + amp_ckpt_copies
        + a2a
        + cp_fwd
        + np.where(multi & ~last, bwd["fwd_working"], 0.0),
        # Inside a checkpointed block's forward (single stage): no loss tensors yet.
        "fwd_block_extra": np.where(
            full & ~multi,
            small + copies + amp_ckpt_copies + a2a + cp_fwd + bwd["fwd_working"],
            -np.inf,
        ),
        "bwd_start_extra": small + loss_grads + a2a + cp_bwd,
        "bwd_end_extra": small + bwd["act_end"] + bwd["temp_end"] - stage_act,
        "embed_extra": small + np.where(x.first, T * m.hidden_size * x.r, 0.0),
        "recompute_excess": recompute_excess_bytes(
            x.rc,
            multi=multi,
            last=last,
            layer_recomputed=layers["layer_recomputed"],
            core=layers["core"],
            outside=out["outside"],
            rope=out["rope"],
            zero_col=x.zero_col,
        ),
        "recompute_extra": np.where(full & multi, small + bwd["temp_recompute"], -np.inf),
        "pipe_per_micro": per_micro + inputs_per_extra_micro,
        "pipe_fixed": fixed - inputs_per_extra_micro,
    }
