"""Activation terms of one micro-batch on one rank, and the loss/backward transients.

Evaluated once per distinct micro-batch shape and layout (see _factorize.per_key).
"""

from __future__ import annotations

import numpy as np

from . import _activations as act
from . import _states as st
from ._model import ModelSpec
from ._rank_activation_profile import profile_activation_terms
from ._rank_states import block_counts, stage_flags

HF, MEGATRON, DEEPSPEED, TORCHTITAN = 0, 1, 2, 3
NONE, SELECTIVE, FULL = 0, 1, 2
LOSS_FULL, LOSS_CHUNKED = 0, 1

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
ACTIVATION_OFFLOAD_RESIDENT_LAYERS = 2.0
"""Blocks whose activations stay on the GPU under activation offloading: the one computing and
the one being copied (torchtune/torchao OffloadActivations with a second stream)."""

ACT_KEYS = (
    "micro_batch_size", "seq_len", "cp", "tp", "pp", "ep", "etp", "capacity_factor_pct",
    "sp", "precision", "attention",
    "recompute", "framework", "stage_pos", "lora_rank", "lora_targets", "loss",
    "activation_offload",
)  # fmt: skip


def _block_parts(
    m: ModelSpec, *, T, s, e, r, amp, tp, sp, eager, lora, rank, bits, moe, etp, capacity
):
    """(full block bytes, attention core, MLP bytes) for a dense or an MoE block."""
    if m.is_mla:
        sp_div = np.where(sp, tp, 1)
        norms = act.hf_norm_bytes(m, T=T, e=e, r=r, amp=amp, sp_div=sp_div, num_consumers=2)
        attention = act.hf_mla_attention_bytes(m, T=T, e=e, r=r, tp=tp, eager=eager, s=s)
        num_up = 1 + (2 if m.shared_expert_intermediate_size else 0) if moe else 2
        norms = norms + act.hf_norm_bytes(
            m, T=T, e=e, r=r, amp=amp, sp_div=sp_div, num_consumers=num_up
        )
        dense_mlp = act.hf_mlp_bytes(m, T=T, e=e, amp=amp, tp=tp)
        block = norms + attention + dense_mlp
    else:
        block = act.hf_layer_bytes(m, T=T, s=s, e=e, r=r, amp=amp, tp=tp, sp=sp, eager=eager)
        dense_mlp = act.hf_mlp_bytes(m, T=T, e=e, amp=amp, tp=tp)
    block = block + act.hf_qk_norm_bytes(m, T=T, r=r, tp=tp)
    mlp = dense_mlp
    if moe:
        e_expert = np.where(amp, 4.0, e)
        mlp = act.hf_moe_bytes(m, T=T, e=e, e_expert=e_expert, amp=amp, etp=etp, capacity=capacity)
        block = block - dense_mlp + mlp
    a_r = m.num_attention_heads / tp
    flash_core = e * T * m.o_dim / tp + 4.0 * a_r * T
    eager_core = flash_core + (4.0 + np.where(e < 4, e, 0.0)) * a_r * s * T
    core = np.where(eager, eager_core, flash_core)
    delta = act.lora_activation_delta_bytes(
        m, T=T, e=e, amp=amp, tp=tp, rank=rank, mask=None, adapted_bits=bits
    )
    block = np.where(lora, block + delta, block)
    return block, core, mlp


def activation_terms(m: ModelSpec, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Activation bytes of one micro-batch on one stage, and the loss/backward transients."""
    if m.profile is not None:
        return profile_activation_terms(m, c)
    prec = c["precision"].astype(np.int64)
    fw = c["framework"].astype(np.int64)
    rc = c["recompute"].astype(np.int64)
    tp = c["tp"].astype(np.float64)
    pp = c["pp"].astype(np.float64)
    ep = c["ep"].astype(np.float64)
    sp = c["sp"]
    first, last = stage_flags(c)
    b = c["micro_batch_size"].astype(np.float64)
    s = c["seq_len"].astype(np.float64)
    cp = c["cp"].astype(np.float64)
    eager = c["attention"] == 1
    T = b * s / cp  # tokens per rank
    h = m.hidden_size
    counts = block_counts(m, c)
    num_layers_local = counts["layer"]
    num_mlp, num_moe = counts["mlp"], counts["moe"]
    e = st.COMPUTE_BYTES[prec]
    r = st.RESIDUAL_BYTES[prec]
    amp = st.IS_AMP[prec]
    loss_tp_div = np.where(fw == MEGATRON, tp, 1.0)
    sp_div = np.where(sp, tp, 1.0)
    rank = c["lora_rank"].astype(np.float64)
    lora = rank > 0
    bits = {name: (c["lora_targets"] & (1 << i)) != 0 for i, name in enumerate(st.LORA_TARGETS)}
    chunked = c["loss"] == LOSS_CHUNKED
    etp = c["etp"].astype(np.float64)
    capacity = c["capacity_factor_pct"].astype(np.float64) / 100.0
    zero_col = np.zeros_like(T)

    parts = dict(T=T, s=s, e=e, r=r, amp=amp, tp=tp, sp=sp, eager=eager, lora=lora, rank=rank,
                 bits=bits, etp=etp, capacity=capacity)  # fmt: skip
    dense_block, core, _ = _block_parts(m, **parts, moe=False)
    moe_block = _block_parts(m, **parts, moe=True)[0] if m.is_moe else zero_col
    # Layer 0 of this stage: dense when the stage holds a dense block.
    layer_full = np.where(num_mlp > 0, dense_block, moe_block)
    layer_ckpt = act.hf_checkpointed_layer_bytes(m, T=T, r=r, tp=tp, sp=sp)
    stage_blocks_full = num_mlp * dense_block + num_moe * moe_block
    stage_hf = np.where(
        rc == FULL,
        layer_ckpt * num_layers_local,
        np.where(rc == SELECTIVE, stage_blocks_full - core * num_layers_local, stage_blocks_full),
    )
    layer_mg = act.megatron_layer_bytes(m, s=s / cp, b=b, tp=tp, sp=sp, recompute_code=rc)
    stage_layers = np.where(fw == MEGATRON, layer_mg * num_layers_local, stage_hf)
    layer_recomputed = np.where(
        fw == MEGATRON,
        act.megatron_layer_bytes(m, s=s / cp, b=b, tp=tp, sp=sp, recompute_code=NONE),
        layer_full,
    )

    rope = 2.0 * s * (m.qk_rope_head_dim if m.is_mla else m.head_dim) * r if m.rotary else 0.0
    outside_all = act.hf_outside_bytes(
        m, T=T, s=s, e=e, r=r, amp=amp, tp=tp, sp=sp, loss_tp_div=loss_tp_div
    )
    chunk_saved, chunk_transient = act.chunked_loss_bytes(
        m, T=T, e=e, r=r, param_e=st.PARAM_BYTES[prec], loss_tp_div=loss_tp_div,
        head_trainable=~lora,
    )  # fmt: skip
    log_softmax = 4.0 * T * m.vocab_size / loss_tp_div
    outside_all = np.where(chunked, outside_all - log_softmax + chunk_saved, outside_all)
    # Pipeline stages: the first keeps the embedding side, the last the head and loss; the last
    # stage's output (the 16-bit logits) is held by the schedule until its backward.
    logits_held = np.where((pp > 1) & ~chunked, e * T * m.vocab_size / loss_tp_div, 0.0)
    outside = np.where(last, outside_all + logits_held, rope)
    # Checkpointed blocks keep their attention_mask argument (a sliding-window mask) alive.
    ckpt_mask = act.hf_checkpointed_mask_bytes(m, T=T, s=s / cp, r=r, eager=eager)
    outside = outside + np.where((rc == FULL) & (fw != MEGATRON), ckpt_mask, 0.0)
    # With checkpointing under torch.distributed.pipelining, a stage keeps L/p - 1 checkpointed
    # inputs per micro-batch (ground truth, first and last stage alike).
    layer_inputs_not_saved = np.where((pp > 1) & (rc == FULL), layer_ckpt, 0.0)
    stage_act = stage_layers + outside - layer_inputs_not_saved
    # Activation offloading keeps two blocks' activations on the GPU, the rest in pinned host
    # memory.
    offload_act = c["activation_offload"].astype(bool) & (num_layers_local > 2)
    per_block = stage_layers / np.maximum(num_layers_local, 1.0)
    offloaded = np.where(
        offload_act, per_block * (num_layers_local - ACTIVATION_OFFLOAD_RESIDENT_LAYERS), 0.0
    )
    stage_act = stage_act - offloaded

    # Autocast's cached 16-bit weight copies (amp): every linear weight from its first use in
    # forward to the end of backward; with checkpointing only the head's copy is kept.
    def linear_numel(group: str) -> int:
        return sum(p.numel for p in m.param_tensors() if p.group == group and len(p.shape) == 2)

    copies_layers = np.where(
        amp,
        2.0 * (linear_numel("layer") * num_layers_local + linear_numel("mlp") * num_mlp
               + linear_numel("moe") * num_moe) / tp,
        0.0,
    )  # fmt: skip
    copies_head = np.where(amp & last, 2.0 * m.vocab_size * h / tp, 0.0)
    autocast_copies = np.where(rc == FULL, copies_head, copies_layers + copies_head)

    # The forward peak is at the loss; in a pipeline the schedule computes the loss apart (in its
    # backward step), and the last stage's forward peaks just before the head writes the logits
    # (counted in `stage_act`): two [T, h] tensors instead (ground truth, pp rank 3).
    full_loss_extra = act.hf_loss_forward_extra_bytes(
        m, T=T, e=e, r=r, amp=amp, loss_tp_div=loss_tp_div
    )
    loss_extra = np.where(
        pp > 1,
        2.0 * e * T * h - logits_held,
        np.where(chunked, chunk_transient, full_loss_extra),
    )
    loss_extra = np.where(last, loss_extra, zero_col)
    # Backward starts with the fp32 gradient of the log-softmax and of the logits (two fp32
    # [T, v] tensors: nll_loss_backward, then _log_softmax_backward_data); a fused chunked loss
    # computed them in forward.
    loss_grads = np.where(last & ~chunked, 8.0 * T * m.vocab_size / loss_tp_div, zero_col)
    loss_grads = loss_grads + np.where(last & (pp > 1), e * T * h / sp_div, 0.0)

    # Expert parallelism: all-to-all dispatch and combine buffers of the routed tokens.
    S = T * m.num_experts_per_tok * np.where(capacity > 0, capacity, 1.0)
    a2a = np.where((ep > 1) & (num_moe > 0), 2.0 * e * S * h, 0.0)
    # Context parallelism (ring attention): the peer's K and V blocks, double-buffered, and in
    # backward their fp32 gradient accumulators. Source: torch.distributed.tensor.experimental
    # context_parallel (_RingRotater / _templated_ring_attention).
    cp_fwd = np.where(cp > 1, 2.0 * 2.0 * e * T * m.kv_dim / tp, 0.0)
    cp_bwd = cp_fwd + np.where(cp > 1, 2.0 * 4.0 * T * m.kv_dim / tp, 0.0)

    # End of backward, in layer 0's MLP backward (ground-truth traces): layer 0's activations
    # less three [T, f] MLP tensors (its recomputation when checkpointed), the rope tables, the
    # checkpointed 16-bit input; seven [T, f] gradients and the residual gradients in flight.
    # An MoE layer 0 is read the same way with its routed rows (T x top_k) and expert width.
    is_moe0 = num_mlp == 0
    f_r = np.where(is_moe0, m.moe_intermediate_size / etp, m.intermediate_size / tp)
    rows = np.where(is_moe0, S, T)
    e_mlp = np.where(is_moe0 & amp, 4.0, e)
    freed_mlp = (3.0 if m.gated_mlp else 1.0) * e_mlp * rows * f_r
    act_end = layer_full - freed_mlp + rope + np.where((rc == FULL) & (r < 4), layer_ckpt, 0.0)
    temp_factor = np.where(is_moe0, BACKWARD_MOE_TEMP_SF, BACKWARD_MLP_TEMP_TF)
    temp_end = temp_factor * e_mlp * rows * f_r + (2.0 * r + np.where(amp, 2.0 * e, 0.0)) * T * h
    # Forward working set of a checkpointed block (nothing saved): the traces show about a full
    # block's activations less two [T, f] tensors (pp rank 0, 1F1B, 4 in flight; CPU MoE traces).
    fwd_working = np.where(rc == FULL, layer_full - 2.0 * e_mlp * rows * f_r, 0.0)
    # Backward of a recomputed layer on a pipeline stage: the seven [T, f] MLP gradients and one
    # residual gradient (the other arrives in the receive buffer).
    temp_recompute = BACKWARD_MLP_TEMP_TF * e_mlp * rows * f_r + e * T * h
    multi = pp > 1
    ckpt_multi = (rc == FULL) & multi
    small = BUFFER_BYTES + INPUT_BYTES_PER_TOKEN * T
    # A pipeline schedule splits the whole batch up front: every micro-batch's input ids stay.
    inputs_per_extra_micro = np.where(multi, INPUT_BYTES_PER_TOKEN * T, 0.0)
    amp_ckpt_copies = np.where(amp & (rc == FULL), copies_layers, 0.0)
    # torch.distributed.pipelining allocates one receive buffer per micro-batch; Megatron two.
    pipe_one = np.where(multi, e * T * h / sp_div, 0.0)
    return {
        "activations_per_layer": stage_layers / np.maximum(num_layers_local, 1.0),
        "activations_outside_layers": outside,
        "activations_autocast_weight_copies": autocast_copies,
        "activations_offloaded": offloaded,
        "stage_act": stage_act,
        "small": small,
        "fwd_extra": small
        + autocast_copies
        + loss_extra
        + amp_ckpt_copies
        + a2a
        + cp_fwd
        + np.where(multi & ~last, fwd_working, 0.0),
        # Inside a checkpointed block's forward (single stage): no loss tensors yet.
        "fwd_block_extra": np.where(
            (rc == FULL) & ~multi,
            small + autocast_copies + amp_ckpt_copies + a2a + cp_fwd + fwd_working,
            -np.inf,
        ),
        "bwd_start_extra": small + loss_grads + a2a + cp_bwd,
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
