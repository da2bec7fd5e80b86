"""Model states of one rank: parameters, master weights, gradients, optimizer states, host bytes.

Evaluated once per distinct layout (see _factorize.per_key): every input column here has few
distinct values in a sweep.
"""

from __future__ import annotations

import numpy as np

from . import _states as st
from ._model import ModelSpec

HF, MEGATRON, DEEPSPEED, TORCHTITAN = 0, 1, 2, 3
ADAMW, ADAMW_FUSED, ADAMW_8BIT, SGD, SGD_MOMENTUM, ADAFACTOR, LION = range(7)
OFFLOAD_NONE, OFFLOAD_OPTIMIZER, OFFLOAD_PARAMS = 0, 1, 2

DEEPSPEED_BUCKET_ELEMS_PER_H2 = 1.0
"""HF Trainer's DeepSpeed "auto" values: reduce_bucket_size = h*h, stage3_prefetch_bucket_size
= 0.9*h*h. Source: transformers/integrations/deepspeed.py (trainer_config_finalize)."""
OFFLOAD_PINNED_BUCKETS = 2.0
"""Pinned host buffers of an offloaded optimizer: two gradient buckets in flight (DeepSpeed
ZeRO-Offload double-buffers the device-to-host gradient copies)."""

STATE_KEYS = (
    "tp", "pp", "dp", "ep", "etp", "zero", "precision", "optimizer", "framework", "sp", "stage_pos",
    "offload", "lora_rank", "lora_targets", "qlora", "optimizer_custom", "optimizer_num_states",
    "optimizer_state_bytes", "optimizer_temp_states", "optimizer_eight_bit",
)  # fmt: skip


def stage_flags(c: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) stage flags from stage_pos: 0 only stage, 1 first, 2 middle, 3 last."""
    pos = c["stage_pos"]
    return (pos <= 1), (pos == 0) | (pos == 3)


def block_counts(m: ModelSpec, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Occurrences of each parameter group on this rank's pipeline stage.

    Assumes: blocks split evenly over stages (ceil(L/pp) on each); an MoE model's leading dense
    blocks sit on the first stage.
    """
    first, last = stage_flags(c)
    layers = np.ceil(m.num_hidden_layers / c["pp"]).astype(np.float64)
    mlp = np.where(first, np.minimum(m.num_dense_layers, layers), 0.0) if m.is_moe else layers
    ones = np.ones_like(layers)
    return {
        "embed": np.where(first, ones, 0.0),
        "layer": layers,
        "mlp": mlp,
        "moe": layers - mlp if m.is_moe else 0.0 * layers,
        "final": np.where(last, ones, 0.0),
        "head": np.where(last, ones, 0.0),
    }


def state_terms(m: ModelSpec, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Model states of one rank and the pieces the phase peaks need."""
    prec = c["precision"].astype(np.int64)
    opt = c["optimizer"].astype(np.int64)
    fw = c["framework"].astype(np.int64)
    zero = c["zero"]
    tp = c["tp"].astype(np.float64)
    dp = c["dp"].astype(np.float64)
    ep = c["ep"].astype(np.float64)
    etp = c["etp"].astype(np.float64)
    sp = c["sp"]
    offload = c["offload"].astype(np.int64)
    lora_rank = c["lora_rank"].astype(np.float64)
    lora = lora_rank > 0
    qlora = c["qlora"] & lora
    first, _ = stage_flags(c)
    counts = block_counts(m, c)
    mixed = st.IS_MIXED[prec]
    fsdp2 = ((fw == HF) | (fw == TORCHTITAN)) & (zero == 3)

    full = st.local_tensors(
        m, tp=tp, ep=ep, etp=etp, counts=counts, shard=False, dp_shard=np.ones_like(dp)
    )
    part = st.local_tensors(m, tp=tp, ep=ep, etp=etp, counts=counts, shard=True, dp_shard=dp)

    # FSDP2 mixed precision keeps fp32 sharded parameters (they are the master copy) and fp32
    # reduced gradients; Megatron keeps an fp32 main-grad buffer.
    param_e = np.where(mixed & fsdp2, 4.0, st.PARAM_BYTES[prec])
    master_e = np.where(fsdp2, 0.0, st.MASTER_BYTES[prec])
    grad_e = np.where(mixed & (fsdp2 | (fw == MEGATRON)), 4.0, st.GRAD_BYTES[prec])
    state_e = st.STATE_BYTES[prec]

    def summed(elem, sharded, *, where=None) -> np.ndarray:
        whole = st.rounded_bytes(full, elem, where=where)
        split = st.rounded_bytes(part, elem, where=where)
        return np.where(sharded, split, whole)

    # ---- LoRA / QLoRA: a frozen base, fp32 adapters on the targeted linear weights ----------
    mask = c["lora_targets"]
    adapter_numel = np.zeros_like(dp)
    quantised = np.zeros_like(dp)  # NF4 bytes of the base linear weights (QLoRA)
    quantised_numel = np.zeros_like(dp)
    for t in full:
        p = t.tensor
        if len(p.shape) != 2 or p.group not in ("layer", "mlp", "moe"):
            continue
        d_out, d_in = p.shape
        adapted = st.lora_adapted(p, mask)
        adapter_numel = adapter_numel + np.where(adapted, lora_rank * (d_in + d_out), 0.0) * t.count
        quantised = quantised + st.nf4_bytes(t.numel) * t.count
        quantised_numel = quantised_numel + t.numel * t.count
    # ZeRO-3/FSDP shard the NF4 base too (bitsandbytes >= 0.43 `bnb_4bit_quant_storage`, the
    # "FSDP-QLoRA" recipe; older stacks kept it whole: xtuner #88).
    quantised = np.where(zero >= 3, quantised / dp, quantised)
    adapter_numel_local = np.where(zero >= 1, np.ceil(adapter_numel / dp), adapter_numel)

    def is_base_linear(p) -> np.ndarray:
        return np.asarray(len(p.shape) == 2 and p.group in ("layer", "mlp", "moe"))

    base_bytes = summed(param_e, zero >= 3)
    base_linear_16 = summed(param_e, zero >= 3, where=is_base_linear)
    base_bytes = np.where(qlora, base_bytes - base_linear_16 + quantised, base_bytes)
    parameters = np.where(lora, base_bytes + st.LORA_ADAPTER_BYTES * np.where(
        zero >= 3, adapter_numel_local, adapter_numel), base_bytes)  # fmt: skip
    trainable_local = np.where(lora, adapter_numel_local, st.total_numel(part))
    trainable_full = np.where(lora, adapter_numel, st.total_numel(full))

    master = np.where(lora, 0.0, summed(master_e, zero >= 1))
    gradients = summed(grad_e, zero >= 2)
    # HF tensor parallel (tp_plan): the embedding's gradient comes out full size on every rank.
    emb_local = st.group_numel(full, "embed")
    gradients = gradients + np.where(
        (fw == HF) & (tp > 1) & (zero < 2) & first,
        (m.num_parameters_in("embed") - emb_local) * grad_e,
        0.0,
    )
    gradients = np.where(
        lora,
        st.LORA_ADAPTER_BYTES * np.where(zero >= 2, adapter_numel_local, adapter_numel),
        gradients,
    )

    # A user optimizer (optimizer_custom; the code stays adamw): its own state count, element
    # size (0: the dtype it steps, as the built-ins), 8-bit layout and step temporaries.
    custom = c["optimizer_custom"]
    custom_e = c["optimizer_state_bytes"]
    state_e = np.where(custom & (custom_e > 0), custom_e, state_e)
    num_states = np.where(custom, c["optimizer_num_states"], st.NUM_STATES[opt])
    temp_states = np.where(custom, c["optimizer_temp_states"], st.STEP_TEMP_STATES[opt])
    state_elem = np.where(lora & ~(custom & (custom_e > 0)), st.LORA_ADAPTER_BYTES, state_e)
    state_numel = np.where(zero >= 1, trainable_local, trainable_full)
    plain_states = np.where(lora, state_elem * state_numel, summed(state_e, zero >= 1))
    optimizer_states = num_states * plain_states
    eight_bit = sum(
        (st.eight_bit_state_bytes(t.numel) * t.count for t in full),
        np.zeros_like(dp),
    )
    eight_bit = np.where(zero >= 1, eight_bit / dp, eight_bit)
    eight_bit = np.where(lora, 2.0 * st.EIGHT_BIT_STATE_BYTES * state_numel, eight_bit)
    optimizer_states = np.where(opt == ADAMW_8BIT, eight_bit, optimizer_states)
    # eight_bit holds two states; a user 8-bit optimizer scales it to its own count.
    optimizer_states = np.where(
        custom & c["optimizer_eight_bit"], eight_bit * num_states / 2.0, optimizer_states
    )
    optimizer_states = np.where(
        opt == ADAFACTOR, st.adafactor_state_bytes(m, numel_local=state_numel), optimizer_states
    )
    num_tensors = sum((t.count for t in full), np.zeros_like(dp))
    optimizer_states = optimizer_states + np.where(
        opt == ADAMW_FUSED, st.FUSED_STEP_TENSOR_BYTES * num_tensors, 0.0
    )
    # foreach temporaries: one state-sized list per (device, dtype) group, groups in turn. HF TP
    # without SP keeps the replicated norms as plain tensors: a separate, smaller group.
    replicated = sum(
        (t.numel * t.count for t in full if t.tensor.tp_split == "rep" and not t.tensor.expert),
        np.zeros_like(dp),
    )
    group_numel = state_numel - np.where(
        (fw == HF) & (tp > 1) & ~sp & (zero < 1) & ~lora, replicated, 0.0
    )
    step_temp = temp_states * state_elem * group_numel
    max_tensor = np.max(np.stack([np.broadcast_to(t.numel, dp.shape) for t in full]), axis=0)
    step_temp = np.where(opt == ADAFACTOR, 2.0 * 4.0 * max_tensor, step_temp)
    # Mixed precision outside FSDP2/Megatron: the fp32 gradient partition the optimizer steps on
    # (DeepSpeed BF16_Optimizer / ZeRO `single_partition_of_fp32_groups` grads).
    step_temp = step_temp + np.where(
        mixed & ~fsdp2 & (fw != MEGATRON) & ~lora, 4.0 * state_numel, 0.0
    )

    # ---- offload: optimizer (+ master) to the host; with params, the weights too -------------
    off_opt = offload >= OFFLOAD_OPTIMIZER
    off_params = offload == OFFLOAD_PARAMS
    layer_numel = st.group_numel(full, "layer") + np.where(
        counts["mlp"] > 0, st.group_numel(full, "mlp"), st.group_numel(full, "moe")
    )
    host_bytes = np.where(
        off_opt,
        optimizer_states + master + 4.0 * state_numel  # CPU Adam steps on fp32 grads
        + OFFLOAD_PINNED_BUCKETS * 2.0 * np.minimum(layer_numel, float(m.hidden_size) ** 2 * 4),
        0.0,
    )  # fmt: skip
    host_bytes = host_bytes + np.where(off_params, parameters + 4.0 * state_numel, 0.0)
    optimizer_states = np.where(off_opt, 0.0, optimizer_states)
    master = np.where(off_opt, 0.0, master)
    step_temp = np.where(off_opt, 0.0, step_temp)
    # ZeRO-Infinity / FSDP CPU offload: only the working set of weights is on the device.
    param_working = 2.0 * 2.0 * layer_numel  # current + prefetched block, 16-bit
    parameters = np.where(off_params, param_working, parameters)
    gradients = np.where(off_params, np.minimum(gradients, 2.0 * param_working), gradients)

    # ---- fp8 recipes: fp8 weight caches and delayed-scaling state --------------------------
    fp8 = st.IS_FP8[prec]
    linear_numel = sum(
        (t.numel * t.count for t in full if len(t.tensor.shape) == 2
         and t.tensor.group in ("layer", "mlp", "moe")),
        np.zeros_like(dp),
    )  # fmt: skip
    num_linears = sum(
        (t.count for t in full if len(t.tensor.shape) == 2
         and t.tensor.group in ("layer", "mlp", "moe")),
        np.zeros_like(dp),
    )  # fmt: skip
    # Under ZeRO-3/FSDP the fp8 casts happen per gathered block: two blocks' worth at a time.
    cached_numel = np.where(
        zero >= 3, linear_numel / np.maximum(counts["layer"], 1.0) * 2.0, linear_numel
    )
    fp8_cache = np.where(
        fp8,
        st.FP8_WEIGHT_CACHE_BYTES * cached_numel + st.FP8_SCALING_BYTES_PER_LINEAR * num_linears,
        0.0,
    )

    # ---- pieces of the phase peaks -----------------------------------------------------------
    sharded_grads = zero >= 2

    def grads_of(group: str) -> np.ndarray:
        local = np.where(sharded_grads, st.group_numel(part, group), st.group_numel(full, group))
        return np.where(lora, 0.0, local * grad_e)

    grad_embed = grads_of("embed")
    grad_layer = grads_of("layer") + np.where(counts["mlp"] > 0, grads_of("mlp"), grads_of("moe"))
    grad_final_head = grads_of("final") + grads_of("head")
    mlp_group_numel = np.where(
        counts["mlp"] > 0, st.group_numel(full, "mlp"), st.group_numel(full, "moe")
    )
    mlp_mats = 3.0 if m.gated_mlp else 2.0
    grad_mlp_done = np.where(
        lora,
        0.0,
        mlp_group_numel / np.where(sharded_grads, dp, 1.0) * grad_e * (mlp_mats - 1.0) / mlp_mats,
    )
    root_numel = (
        st.group_numel(full, "embed") + st.group_numel(full, "final") + st.group_numel(full, "head")
    )
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
    # QLoRA dequantises one linear weight at a time to 16-bit (forward and backward).
    max_linear = np.max(
        np.stack([np.broadcast_to(t.numel, dp.shape) for t in full
                  if len(t.tensor.shape) == 2 and t.tensor.group in ("layer", "mlp")]
                 or [np.zeros_like(dp)]),
        axis=0,
    )  # fmt: skip
    dequant = np.where(qlora, 2.0 * max_linear, 0.0)
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
        "host_bytes": host_bytes,
        "persistent": states + ds_buffers + fp8_cache,
        "fp8_weight_cache": fp8_cache,
        "fsdp_fwd": fsdp_fwd + dequant,
        "end_grads": grads_end + fsdp_bwd + dequant,
        "optimizer_peak": states + gradients + step_temp + fp8_cache,
    }
