"""Model states of one rank: parameters, master weights, gradients, optimizer states, host bytes.

Evaluated once per distinct layout (see _factorize.per_key): every input column here has few
distinct values in a sweep. The assembly only: the formulas are in the rank's inventory
(_states.py) and in one module per technique (_data_parallel, _tensor_parallel, _lora,
_optimizers, _offload, _fp8, _precision).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._codes import OVERLAP_COMM_OFF
from ._data_parallel import (
    ZERO_GRADIENTS,
    ZERO_PARAMETERS,
    ZERO_STATES,
    deepspeed_buffer_bytes,
    fp32_gradient_partition_bytes,
    fsdp2_block_gradient_bytes,
    fsdp2_buffer_bytes,
    is_fsdp2,
    model_state_element_bytes,
    unsharded_accumulated_gradient_bytes,
)
from ._fp8 import fp8_cache_bytes
from ._frameworks import (
    ADAPTERS_IN_PARAM_DTYPE,
    FP8_WEIGHT_CACHE,
    FP32_MAIN_GRAD_BUFFER,
    FSDP1_FULL_FINETUNE,
    FSDP1_LORA,
    FSDP2_EMBEDDING_UNIT,
    FSDP_ACCUMULATES_UNSHARDED,
    LOAD_POLICY,
    LOAD_SHARDED_QLORA_POLICY,
    QLORA_DOUBLE_QUANT,
    QLORA_EVERY_LINEAR,
    QLORA_KBIT_PREPARED,
    QLORA_STABLE_EMBEDDING,
    ZERO_BUCKET_BUFFERS,
    recipe_optimizer,
    state_shard_degree,
)
from ._fsdp1 import (
    fsdp1_backward_prefetch_bytes,
    fsdp1_forward_blocks_in_flight,
    fsdp1_reduce_scatter_input_element_bytes,
)
from ._load import load_buffer_bytes, load_host_bytes, load_policy
from ._lora import (
    LORA_ADAPTER_BYTES,
    Adapters,
    kbit_prepared_base_bytes,
    kbit_prepared_rows,
    kbit_pure_16,
    lora_parameter_bytes,
    nf4_base_bytes,
    qlora_dequant_bytes,
    qlora_quantised,
    qlora_stable_embedding_bytes,
    rank_adapters,
    sharded_qlora_adapters_16bit,
)
from ._model import ModelSpec
from ._mx import SCALING_BYTES_PER_LINEAR, WEIGHT_CACHE_BYTES
from ._offload import deepspeed_offloaded_states, offloaded_states
from ._optimizers import (
    optimizer_state_bytes,
    paged_state_bytes,
    state_counts,
    state_element_bytes,
    step_temporary_bytes,
)
from ._pipeline import block_counts, stage_flags
from ._precision import IS_AMP, IS_FP8, IS_MIXED, PARAM_BYTES, STATE_BYTES
from ._states import (
    LocalTensor,
    group_numel,
    largest_layer_numel,
    layer_numel,
    local_tensors,
    rank_bytes,
    total_numel,
)
from ._tensor_parallel import (
    hf_embedding_gradient_bytes,
    hf_replicated_group_numel,
    hf_tied_embedding_backward_bytes,
)
from ._vision_lora import tower_adapter_numel
from ._vision_memory import held_vision_parameter_numel

STATE_KEYS = (
    "tp",
    "pp",
    "dp",
    "cp",
    "dp_shard",
    "ep",
    "etp",
    "zero",
    "precision",
    "optimizer",
    "framework",
    "sp",
    "stage_pos",
    "offload",
    "lora_rank",
    "lora_targets",
    "qlora",
    "zero_bucket_elems",
    "overlap_comm",
    "optimizer_custom",
    "optimizer_num_states",
    "optimizer_state_bytes",
    "optimizer_temp_states",
    "optimizer_eight_bit",
    "optimizer_in_backward",
    "load",
    "freeze_vision",
    "lora_scope",
)


@dataclass(frozen=True, slots=True)
class RankLayout:
    """The columns of one rank's layout (one value per key), and its tensor inventory: `full`
    unsharded by data parallelism, `part` sharded over the shard group (ZeRO-3/FSDP).

    `dp` is the group that shards model states: data x context parallel ranks
    (state_shard_degree). `adapter_e`: bytes per LoRA adapter element (and its gradient)."""

    prec: np.ndarray
    opt: np.ndarray
    fw: np.ndarray
    zero: np.ndarray
    tp: np.ndarray
    dp: np.ndarray
    sp: np.ndarray
    offload: np.ndarray
    lora_rank: np.ndarray
    lora: np.ndarray
    qlora: np.ndarray
    first: np.ndarray
    counts: dict[str, np.ndarray]
    mixed: np.ndarray
    fsdp2: np.ndarray
    main_grad_buffer: np.ndarray
    adapter_e: np.ndarray
    full: list[LocalTensor]
    part: list[LocalTensor]
    zero_bucket_elems: np.ndarray
    overlap_off: np.ndarray


def rank_layout(m: ModelSpec, c: dict[str, np.ndarray]) -> RankLayout:
    """The symbols of the rows `c` (per-key columns), bound once."""
    fw = c["framework"].astype(np.int64)
    prec = c["precision"].astype(np.int64)
    tp = c["tp"].astype(np.float64)
    dp = state_shard_degree(c["dp"], c["cp"], c["dp_shard"])
    ep, etp = c["ep"].astype(np.float64), c["etp"].astype(np.float64)
    lora_rank = c["lora_rank"].astype(np.float64)
    lora = lora_rank > 0
    counts = block_counts(m, c)
    shards: dict[str, Any] = {"tp": tp, "ep": ep, "etp": etp, "counts": counts}
    return RankLayout(
        prec=prec,
        opt=recipe_optimizer(c["optimizer"].astype(np.int64), fw=fw, qlora=c["qlora"] & lora),
        fw=fw,
        zero=c["zero"],
        tp=tp,
        dp=dp,
        sp=c["sp"],
        offload=c["offload"].astype(np.int64),
        lora_rank=lora_rank,
        lora=lora,
        qlora=c["qlora"] & lora,
        first=stage_flags(c)[0],
        counts=counts,
        mixed=IS_MIXED[prec],
        fsdp2=is_fsdp2(fw, c["zero"]),
        main_grad_buffer=FP32_MAIN_GRAD_BUFFER[fw],
        adapter_e=np.where(
            ADAPTERS_IN_PARAM_DTYPE[fw]
            | sharded_qlora_adapters_16bit(
                QLORA_KBIT_PREPARED[fw], qlora=c["qlora"] & lora, zero=c["zero"]
            ),
            PARAM_BYTES[prec],
            LORA_ADAPTER_BYTES,
        ),
        full=local_tensors(m, **shards, shard=False, dp_shard=np.ones_like(dp)),
        part=local_tensors(m, **shards, shard=True, dp_shard=dp),
        zero_bucket_elems=c["zero_bucket_elems"].astype(np.float64),
        overlap_off=c["overlap_comm"].astype(np.int64) == OVERLAP_COMM_OFF,
    )


def _parameter_bytes(x: RankLayout, param_e: np.ndarray, adapters: Adapters) -> np.ndarray:
    """Working weights (ZeRO-3/FSDP: the shard); LoRA: a frozen base (QLoRA: NF4 block
    linears, the rest fp32 where the stack prepares the model for k-bit training) and fp32
    adapters."""
    sharded = x.zero >= ZERO_PARAMETERS
    base = rank_bytes(x.full, x.part, param_e, sharded)
    every = QLORA_EVERY_LINEAR[x.fw]
    base_linear = rank_bytes(
        x.full, x.part, param_e, sharded, where=lambda p: qlora_quantised(p, every)
    )
    nf4 = nf4_base_bytes(
        x.full, dp=x.dp, sharded=sharded, every_linear=every,
        double_quant=QLORA_DOUBLE_QUANT[x.fw],
    )  # fmt: skip
    kept = qlora_stable_embedding_bytes(
        x.full, on=x.qlora & QLORA_STABLE_EMBEDDING[x.fw], param_e=param_e
    )
    prepared = kbit_prepared_rows(QLORA_KBIT_PREPARED[x.fw], zero=x.zero)
    upcast = kbit_pure_16(x.prec, prepared=prepared)
    qlora_base = kbit_prepared_base_bytes(base, base_linear, param_e=param_e, upcast=upcast)
    return kept + lora_parameter_bytes(
        np.where(x.qlora, qlora_base, base),
        base_linear,
        nf4,
        lora=x.lora,
        qlora=x.qlora,
        adapters=adapters.kept(sharded),
        adapter_e=x.adapter_e,
    )


def _gradient_bytes(
    m: ModelSpec, x: RankLayout, grad_e: np.ndarray, adapters: Adapters
) -> np.ndarray:
    """Gradients (ZeRO-2+: the shard), HF TP's full-size embedding gradient; LoRA: the
    adapters' gradients only (in the adapters' dtype)."""
    sharded = x.zero >= ZERO_GRADIENTS
    gradients = rank_bytes(x.full, x.part, grad_e, sharded) + hf_embedding_gradient_bytes(
        m,
        x.full,
        fw=x.fw,
        tp=x.tp,
        grads_sharded=sharded,
        first=x.first,
        grad_e=grad_e,
        last=x.counts["head"] > 0,
    )
    return np.where(x.lora, x.adapter_e * adapters.kept(sharded), gradients)


def largest_stepped_numel(x: RankLayout, *, sharded: np.ndarray) -> np.ndarray:
    """Elements of the largest tensor a per-parameter optimizer step (LOOP_TEMP_TENSORS) runs
    on: the rank's largest (tensor-parallel) parameter; with sharded states, DeepSpeed's flat
    partition (inf: the whole group, `step_temporary_bytes` bounds it) or, elsewhere, that
    parameter's shard (FSDP2 shards each parameter over dp); LoRA: 0.
    Source: deepspeed 0.19.8 runtime/zero/stage_1_and_2.py (the optimizer steps
    single_partition_of_fp32_groups, one flat tensor per group); torch 2.13
    distributed/fsdp/_fully_shard/_fsdp_param.py (a DTensor shard per parameter).
    Ignores: FSDP1's flat units (a block's shard, larger than one parameter's); the LoRA
    adapters' temporaries (r x width elements: negligible)."""
    largest = np.max(np.stack([np.broadcast_to(t.numel, x.dp.shape) for t in x.full]), axis=0)
    flat = ZERO_BUCKET_BUFFERS[x.fw]
    per_rank = np.where(sharded, np.where(flat, np.inf, largest / x.dp), largest)
    return np.where(x.lora, 0.0, per_rank)


def _optimizer_bytes(
    m: ModelSpec, x: RankLayout, c: dict[str, np.ndarray], state_numel: np.ndarray
) -> dict[str, np.ndarray]:
    """Optimizer states (ZeRO-1+: the shard) and the step's temporaries, for a built-in (the
    registry, _optimizers.py) or a user optimizer (the `optimizer_*` columns)."""
    sharded = x.zero >= ZERO_STATES
    state_e, state_elem = state_element_bytes(
        c, state_bytes=STATE_BYTES[x.prec], lora=x.lora, adapter_bytes=x.adapter_e, opt=x.opt
    )
    num_states, temp_states = state_counts(c, x.opt)
    plain = np.where(x.lora, state_elem * state_numel, rank_bytes(x.full, x.part, state_e, sharded))
    separate = hf_replicated_group_numel(
        x.full, fw=x.fw, tp=x.tp, sp=x.sp, states_sharded=sharded, lora=x.lora, dp=x.dp
    )
    step_temp = step_temporary_bytes(
        x.full,
        opt=x.opt,
        temp_states=temp_states,
        state_elem=state_elem,
        group_numel=state_numel - separate,
        dp=x.dp,
        largest_stepped_numel=largest_stepped_numel(x, sharded=sharded),
    ) + fp32_gradient_partition_bytes(
        state_numel, mixed=x.mixed, fsdp2=x.fsdp2, main_grad_buffer=x.main_grad_buffer, lora=x.lora
    )
    optimizer_states = optimizer_state_bytes(
        m,
        x.full,
        c=c,
        opt=x.opt,
        num_states=num_states,
        plain_states=plain,
        state_numel=state_numel,
        sharded=sharded,
        dp=x.dp,
        lora=x.lora,
    )
    paged = paged_state_bytes(
        x.full,
        x.part,
        opt=x.opt,
        sharded=sharded,
        lora=x.lora,
        lora_rank=x.lora_rank,
        mask=c["lora_targets"],
        dp=x.dp,
    )
    return {
        "optimizer_states": optimizer_states - paged,
        "optimizer_step_temporaries": step_temp,
        "paged_optimizer_bytes": paged,
    }


def _dequant(x: RankLayout) -> np.ndarray:
    """QLoRA's dequantised weight in flight (qlora_dequant_bytes), over every Linear where the
    framework quantises them all (FrameworkSpec.qlora_every_linear)."""
    return qlora_dequant_bytes(
        x.full, qlora=x.qlora, dp=x.dp, every_linear=QLORA_EVERY_LINEAR[x.fw]
    )


def _end_of_backward_gradients(
    m: ModelSpec, x: RankLayout, grad_e: np.ndarray, gradients: np.ndarray, fsdp_active, *, streams
) -> tuple[np.ndarray, np.ndarray]:
    """Gradients alive at the end of backward: all but the embedding's, layer 0's attention and
    one MLP matrix (and, under FSDP2, the root's and two layers' not yet reduce-scattered); and
    those alive in the top block's MLP backward. Where ZeRO-Offload `streams` them, the one
    gradient in flight (`gradients`) at either moment (deepspeed_offloaded_states).
    Source: the ground-truth traces (the end-of-backward peak is in layer 0's MLP backward,
    see _rank_activations._backward_transients)."""
    sharded = x.zero >= ZERO_GRADIENTS
    full, part, counts = x.full, x.part, x.counts

    def grads_of(group: str) -> np.ndarray:
        local = np.where(sharded, group_numel(part, group), group_numel(full, group))
        return np.where(x.lora, 0.0, local * grad_e)

    grad_layer = grads_of("layer") + np.where(counts["mlp"] > 0, grads_of("mlp"), grads_of("moe"))
    mlp_group_numel = np.where(
        counts["mlp"] > 0, group_numel(full, "mlp"), group_numel(full, "moe")
    )
    mlp_mats = 3.0 if m.gated_mlp else 2.0
    grad_mlp_done = np.where(
        x.lora,
        0.0,
        mlp_group_numel / np.where(sharded, x.dp, 1.0) * grad_e * (mlp_mats - 1.0) / mlp_mats,
    )
    grads_end = gradients - grads_of("embed") - grad_layer + grad_mlp_done
    grad_final_head = grads_of("final") + grads_of("head")
    end = grads_end - np.where(fsdp_active, grad_layer + grad_final_head, 0.0)
    # The top block's MLP backward (a single stage recomputing it, see single_stage_recompute_
    # delta): the head's and final norm's gradients and the MLP matrices done so far.
    top = np.where(fsdp_active, 0.0, grad_final_head) + grad_mlp_done
    return np.where(streams, gradients, end), np.where(streams, gradients, top)


def _frozen_vision_bytes(m: ModelSpec, x: RankLayout, c: dict[str, np.ndarray], param_e):
    """A frozen tower's and projector's weights on the first stage (freeze_vision: held, never
    trained; left out of the rank's trainable inventory, _vision_memory.vision_group_counts), or
    the blocks of a trained tower no gradient reaches (held_vision_parameter_numel): in the
    parameters' dtype, sharded over the shard group under ZeRO-3 / FSDP (which shards frozen
    parameters as any other).
    Source: torch.distributed.fsdp.fully_shard (every parameter of the module is sharded).
    Assumes: one allocation per tensor kind is not rounded per tensor (the tower's tensors are
    large: rounding adds under 0.1%)."""
    if m.vision is None:  # a text model: nothing (x + 0.0 is x)
        return np.zeros_like(x.dp)
    numel = held_vision_parameter_numel(m, np.asarray(c["freeze_vision"], dtype=bool))
    shard = np.where(x.zero >= ZERO_PARAMETERS, x.dp, 1.0)
    return np.where(x.first, numel / shard * param_e, 0.0)


def _tower_adapters(
    m: ModelSpec, x: RankLayout, c: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """A VLM's tower and projector adapters on the first stage (PEFT's matching:
    _vision_lora.tower_adapter_numel): those a gradient reaches, trained as the language
    model's, and LLaVA's unreached ones, held only. Replicated under tensor parallelism, as
    the tower is."""
    if m.vision is None:  # a text model: none
        return np.zeros_like(x.dp), np.zeros_like(x.dp)
    reached, unreached = tower_adapter_numel(m.vision, c)
    on = x.first & x.lora
    return np.where(on, reached, 0.0), np.where(on, unreached, 0.0)


def _adapters(
    m: ModelSpec, x: RankLayout, c: dict[str, np.ndarray], *, sharded
) -> tuple[Adapters, np.ndarray]:
    """The rank's trained LoRA adapters (rank_adapters: the language model's, and a VLM tower's
    a gradient reaches) and the tower's it does not reach (_tower_adapters)."""
    reached, unreached = _tower_adapters(m, x, c)
    adapters = rank_adapters(
        x.full, rank=x.lora_rank, mask=c["lora_targets"], dp=x.dp, sharded=sharded, extra=reached
    )
    return adapters, unreached


def _held_adapter_bytes(x: RankLayout, numel: np.ndarray) -> np.ndarray:
    """Adapters no gradient reaches (LLaVA's tower blocks after its feature layer): their
    parameters only, in the adapters' dtype, sharded as the others under ZeRO-3 / FSDP."""
    shard = np.where(x.zero >= ZERO_PARAMETERS, x.dp, 1.0)
    return x.adapter_e * numel / shard


def state_terms(m: ModelSpec, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Model states of one rank and the pieces the phase peaks need.

    Returns bytes per key: parameters, master_weights, gradients, optimizer_states,
    optimizer_step_temporaries, host_bytes (what stays on the device and what offload moves),
    fp8_weight_cache; persistent (states + framework buffers), fsdp_fwd (forward-peak buffers),
    end_grads (gradients and buffers at the end of backward), top_grads (those in the top
    block's backward: under FSDP2 with the blocks' backward buffers and the block's unsharded
    gradients, fsdp2_block_gradient_bytes), optimizer_peak.
    """
    x = rank_layout(m, c)
    param_e, master_e, grad_e = model_state_element_bytes(
        x.prec, fsdp2=x.fsdp2, main_grad_buffer=x.main_grad_buffer
    )
    states_sharded = x.zero >= ZERO_STATES
    adapters, tower_unreached = _adapters(m, x, c, sharded=states_sharded)
    trainable_full = np.where(x.lora, adapters.numel, total_numel(x.full))
    trainable_local = np.where(x.lora, adapters.numel_shard, total_numel(x.part))
    state_numel = np.where(states_sharded, trainable_local, trainable_full)
    master = rank_bytes(x.full, x.part, master_e, states_sharded)
    states = {
        "parameters": _parameter_bytes(x, param_e, adapters),
        "master_weights": np.where(x.lora, 0.0, master),
        "gradients": _gradient_bytes(m, x, grad_e, adapters),
        **_optimizer_bytes(m, x, c, state_numel),
    }
    layer = layer_numel(x.full, x.counts)
    s, ds = _offloaded(m, x, states, state_numel=state_numel, layer=layer, grad_e=grad_e)
    fp8_cache, fsdp_active = _fp8_cache(x), x.fsdp2 & (x.dp > 1)
    fsdp_fwd, fsdp_bwd = _fsdp2_buffers(m, x, layer, active=fsdp_active, single_stage=c["pp"] <= 1)
    dequant = _dequant(x)
    grads_end, grads_top = _end_of_backward_gradients(
        m, x, grad_e, s["gradients"], fsdp_active, streams=ds["streams"]
    )
    in_backward = c["optimizer_in_backward"]
    s = _optimizer_in_backward(x, s, grad_e, in_backward=in_backward)
    grads_end = np.where(in_backward, s["gradients"], grads_end)
    grads_persistent, grads_end, grads_top = _grad_buffer(
        x, s["gradients"], grads_end, grads_top, in_backward=in_backward
    )
    held = _frozen_vision_bytes(m, x, c, param_e) + _held_adapter_bytes(x, tower_unreached)
    s = {**s, "parameters": s["parameters"] + held}
    held = s["parameters"] + s["master_weights"] + s["optimizer_states"]
    return {
        **s,
        **_load_terms(x, c, param_e, states["parameters"], resident=s["parameters"]),
        "persistent": held + ds["buffers"] + fp8_cache,
        "fp8_weight_cache": fp8_cache,
        "fsdp_fwd": fsdp_fwd + dequant,
        "fsdp_bwd_start": fsdp_fwd + _fsdp1_prefetch(x, layer, active=fsdp_active) + dequant,
        "end_grads": grads_end + fsdp_bwd + dequant,
        "grads_persistent": grads_persistent,
        "tied_embedding_grad": _tied_embedding_grad(m, x, grad_e, single_stage=c["pp"] <= 1),
        "top_grads": np.where(in_backward, s["gradients"], grads_top)
        + fsdp_bwd
        + _fsdp2_block_grads(m, x, active=fsdp_active),
        "optimizer_peak": held + s["gradients"] + s["optimizer_step_temporaries"] + fp8_cache,
        **_accumulation_terms(x, ds, trainable_full, s["gradients"]),
    }


def _accumulation_terms(
    x: RankLayout, ds: dict[str, np.ndarray], trainable_full, gradients
) -> dict[str, np.ndarray]:
    """What gradient accumulation adds: DeepSpeed's terms (accum_end_grads, host_accum_bytes:
    deepspeed_offloaded_states) and `unsharded_accum_grads`, what accumulating unsharded
    gradients adds over micro-batches after the first (unsharded_accumulated_gradient_bytes),
    on FSDP rows of a framework that turns gradient sync off while it accumulates; the peaks
    count them only with more than one micro-batch. The unsharded gradient's dtype is the
    gathered parameters' (16-bit under mixed precision or autocast: the FSDP wrappers'
    param_dtype; LoRA adapters: their own dtype)."""
    active = FSDP_ACCUMULATES_UNSHARDED[x.fw] & (x.zero == ZERO_PARAMETERS) & (x.dp > 1)
    policy = x.mixed | IS_AMP[x.prec]
    gathered_e = np.where(policy, 2.0, PARAM_BYTES[x.prec])
    unsharded = unsharded_accumulated_gradient_bytes(
        active=active,
        trainable_numel=trainable_full,
        element_bytes=np.where(x.lora, x.adapter_e, gathered_e),
        gradient_bytes=gradients,
    )
    return {
        "accum_end_grads": ds["accum_end_grads"],
        "host_accum_bytes": ds["host_accum_bytes"],
        "unsharded_accum_grads": unsharded,
    }


def _offloaded(
    m: ModelSpec, x: RankLayout, states: dict[str, np.ndarray], *, state_numel, layer, grad_e
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """offloaded_states, then DeepSpeed ZeRO-Offload's own layout where the stack has it
    (deepspeed_offloaded_states): (states, DeepSpeed's extra terms, `buffers` among them: its
    bucket buffers, deepspeed_buffer_bytes, and the offload staging buffer)."""
    s = offloaded_states(
        m, offload=x.offload, states=states, state_numel=state_numel, layer_numel=layer
    )
    buffers = deepspeed_buffer_bytes(
        m,
        fw=x.fw,
        zero=x.zero,
        dp=x.dp,
        layer_numel=layer,
        offload=x.offload,
        bucket_elems=x.zero_bucket_elems,
        overlap_off=x.overlap_off,
    )
    s, ds = deepspeed_offloaded_states(
        m,
        fw=x.fw,
        zero=x.zero,
        offload=x.offload,
        lora=x.lora,
        dp=x.dp,
        full=x.full,
        grad_e=grad_e,
        param_e=PARAM_BYTES[x.prec],
        state_numel=state_numel,
        before=states,
        states=s,
    )
    # A paged optimizer's large state buffers are outside torch's allocator, backed by the
    # host under pressure (paged_state_bytes): counted on the host, not the device.
    paged = states["paged_optimizer_bytes"]
    s = {**s, "host_bytes": s["host_bytes"] + paged, "paged_optimizer_bytes": paged}
    return s, {**ds, "buffers": buffers + ds["gpu_staging"]}


def _load_terms(
    x: RankLayout, c: dict[str, np.ndarray], param_e, parameters, *, resident
) -> dict[str, np.ndarray]:
    """The load phase's state columns (engine/_load.py): `load_peak`, the resident parameters
    and the load's GPU buffer, and `load_host_bytes`, from the rank's model
    slice: the unsharded tensors of its tp/pp part in the parameters' dtype (LoRA: the rank's
    `parameters`, base and adapters, times the shard degree where ZeRO-3 shards them);
    `resident`: the parameter bytes the GPU keeps (none of the offloaded ones).
    Assumes: a block's and the largest tensor's bytes in the parameters' dtype (a QLoRA base
    quantises each 16-bit tensor as it reaches the GPU: that transient is ignored)."""
    sharded = x.zero >= ZERO_PARAMETERS
    mode = load_policy(
        c["load"],
        LOAD_POLICY[x.fw],
        sharded_qlora_default=LOAD_SHARDED_QLORA_POLICY[x.fw],
        sharded_qlora=x.qlora & sharded,
    )
    whole = rank_bytes(x.full, x.part, param_e, False)
    slice_bytes = np.where(x.lora, np.where(sharded, parameters * x.dp, parameters), whole)
    present = [t for t in x.full if len(t.tensor.shape) >= 1]
    largest = np.max(
        np.stack([np.where(t.count > 0, t.numel, 0.0) * np.ones_like(x.dp) for t in present]),
        axis=0,
    )
    buffer = load_buffer_bytes(
        mode,
        slice_bytes=slice_bytes,
        resident_param_bytes=resident,
        block_bytes=param_e * largest_layer_numel(x.full, x.counts),
        largest_tensor_bytes=param_e * largest,
        shard_degree=np.where(sharded, x.dp, 1.0),
    )
    return {
        "load_peak": resident + buffer,
        "load_host_bytes": load_host_bytes(mode, slice_bytes=slice_bytes),
    }


def _fp8_cache(x: RankLayout) -> np.ndarray:
    """Quantized weight caches where the recipe keeps them (Transformer Engine's fp8, MXFP8
    and NVFP4 recipes; not torchao's, whose mx_mm / Float8Linear save the bf16 weight)."""
    return fp8_cache_bytes(
        x.full,
        fp8=IS_FP8[x.prec] & FP8_WEIGHT_CACHE[x.fw],
        params_sharded=x.zero >= ZERO_PARAMETERS,
        num_layers=x.counts["layer"],
        dp=x.dp,
        cache_bytes_per_element=WEIGHT_CACHE_BYTES[x.prec],
        scaling_bytes_per_linear=SCALING_BYTES_PER_LINEAR[x.prec],
    )


TIED_GRAD_COPIES = 2.0
"""With tied embeddings the embedding's backward writes a second gradient of the shared weight
while the head's is held, and their sum is a third (accumulated out of place), before the two
older ones are freed: two weight-sized tensors beyond the gradients.
Source: torch/csrc/autograd/functions/accumulate_grad.h (the weight's .grad exists: the new
gradient is added to it); the conformance matrix (bench/conformance.py: tiny tied Llama, fp32,
128 tokens: the traced backward peak is the states, the gradients and 262.7 MB = 2.0 x the
131.3 MB embedding)."""


def _tied_embedding_grad(m: ModelSpec, x: RankLayout, grad_e, *, single_stage) -> np.ndarray:
    """The extra gradients of a tied embedding at its backward, where one rank holds both
    uses (a single pipeline stage: a pipeline keeps a copy per stage); none for a frozen,
    LoRA, embedding."""
    if not m.tie_word_embeddings:
        return np.zeros_like(x.dp)
    embed = group_numel(x.full, "embed") * TIED_GRAD_COPIES * grad_e
    embed = embed + hf_tied_embedding_backward_bytes(m, x.full, fw=x.fw, tp=x.tp, grad_e=grad_e)
    return np.where(single_stage & ~x.lora, embed, 0.0)


def _grad_buffer(x: RankLayout, gradients, grads_end, grads_top, *, in_backward) -> tuple:
    """(gradients alive outside the step, at the end of backward, in the top block's backward)
    where the framework's DDP keeps one contiguous fp32 grad buffer for the run
    (FrameworkSpec.fp32_main_grad_buffer: Megatron's), zeroed, never freed: all of it is there
    in every phase (and not again among the top block's gradients).
    Source: megatron/core/distributed/param_and_grad_buffer.py (_ParamAndGradBuffer.grad_data);
    traced: tests/data/framework_traces/megatron_gpt_local.json (grad_buffer_bytes)."""
    buffer = x.main_grad_buffer & ~in_backward
    return (
        np.where(buffer, gradients, 0.0),
        np.where(buffer, gradients, grads_end),
        np.where(x.main_grad_buffer, 0.0, grads_top),
    )


def _fsdp2_block_grads(m: ModelSpec, x: RankLayout, *, active) -> np.ndarray:
    """FSDP2's unsharded gradients of the block at work (fsdp2_block_gradient_bytes): its MLP's
    gathered elements, in the dtype FSDP2 gathers the parameters in; none for LoRA (frozen
    base weights) and, untraced at real size, for a stage of MoE blocks only."""
    mlp = np.where(x.counts["mlp"] > 0, group_numel(x.part, "mlp"), 0.0)
    policy = x.mixed | IS_AMP[x.prec]
    return fsdp2_block_gradient_bytes(
        active=active & ~x.lora,
        mlp_numel=mlp * x.dp,
        mlp_mats=3.0 if m.gated_mlp else 2.0,
        element_bytes=np.where(policy, 2.0, PARAM_BYTES[x.prec]),
    )


def _runs_fsdp1(x: RankLayout) -> np.ndarray:
    """Rows whose ZeRO-3 is FSDP1: a full fine-tune under FrameworkSpec.fsdp1_full_finetune, a
    LoRA job under FrameworkSpec.fsdp1_lora."""
    return np.where(x.lora, FSDP1_LORA[x.fw], FSDP1_FULL_FINETUNE[x.fw])


def _fsdp2_buffers(
    m: ModelSpec, x: RankLayout, layer: np.ndarray, *, active, single_stage
) -> tuple[np.ndarray, ...]:
    """FSDP2's unsharded buffers (fsdp2_buffer_bytes) with the framework's units: torchtitan
    wraps the embedding apart, resharded after forward, and gathers no block at the loss
    (FrameworkSpec.fsdp2_embedding_unit); elsewhere the root holds embedding, norm and head.
    FSDP1 (FrameworkSpec.fsdp1_full_finetune, a full fine-tune): no block gathered at the loss
    and no reduce-scatter input held (engine/_fsdp1.py).

    A gathered tensor is its padded shard times the ranks (dim 0 padded up to a multiple of dp:
    four experts over 64 ranks gather 64 rows), in the dtype the parameters are gathered in
    (MixedPrecisionPolicy's param_dtype under mixed precision, else the parameters' own).
    Source: torch.distributed.fsdp.fully_shard (FSDP2 all-gathers the padded shards); the
    conformance matrix (bench/conformance.py: fp32 FSDP2 and 64-rank MoE cells)."""
    own_unit = FSDP2_EMBEDDING_UNIT[x.fw]
    gathered = x.dp  # the shards of `part` times the ranks that hold them
    head_numel = group_numel(x.part, "final") + group_numel(x.part, "head")
    embed_numel = np.where(own_unit, 0.0, group_numel(x.part, "embed"))
    root_numel = (head_numel + embed_numel) * gathered
    # In the blocks' backward the root holds the head's gradients (a tied embedding's is the
    # head's where one stage holds both); an embedding's own comes last, and a LoRA job's
    # frozen root has none.
    head_uses_embed = m.tie_word_embeddings & single_stage
    grad_numel = head_numel + np.where(head_uses_embed, embed_numel, 0.0)
    root_grad_numel = np.where(x.lora, 0.0, grad_numel * gathered)
    # Mixed precision (and autocast, which FSDP2 runs with the same MixedPrecisionPolicy: the
    # tracer's and accelerate's reading) gathers 16 bits and reduces in fp32.
    policy = x.mixed | IS_AMP[x.prec]
    gather_e = np.where(policy, 2.0, PARAM_BYTES[x.prec])
    fsdp1 = _runs_fsdp1(x)  # FSDP1 (engine/_fsdp1.py)
    gathered_layer = largest_layer_numel(x.part, x.counts) * gathered
    fwd, bwd = fsdp2_buffer_bytes(
        active=active,
        root_numel=root_numel,
        root_grad_numel=root_grad_numel,
        layer_numel=gathered_layer,
        layers_in_flight=fsdp1_forward_blocks_in_flight(fsdp1, np.where(own_unit, 0.0, 1.0)),
        element_bytes=gather_e,
        reduce_bytes=fsdp1_reduce_scatter_input_element_bytes(
            fsdp1, np.where(policy, 4.0, PARAM_BYTES[x.prec])
        ),
    )
    return fwd, bwd


def _fsdp1_prefetch(x: RankLayout, layer: np.ndarray, *, active) -> np.ndarray:
    """FSDP1's block prefetched at the start of backward (fsdp1_backward_prefetch_bytes; FSDP2's
    start of backward holds its forward buffers only): the largest gathered block in the
    all-gather dtype (16-bit under a mixed-precision policy)."""
    fsdp1 = _runs_fsdp1(x)
    policy = x.mixed | IS_AMP[x.prec]
    return fsdp1_backward_prefetch_bytes(
        active & fsdp1,
        layer_numel=largest_layer_numel(x.part, x.counts) * x.dp,
        element_bytes=np.where(policy, 2.0, PARAM_BYTES[x.prec]),
    )


def _optimizer_in_backward(
    x: RankLayout, s: dict[str, np.ndarray], grad_e: np.ndarray, *, in_backward
) -> dict[str, np.ndarray]:
    """Model states when each parameter steps as soon as its gradient is accumulated, and the
    gradient is freed at once: no gradient set is ever whole and there is no step of its own.
    What is left is the largest single gradient (being stepped); LoRA adapters' are negligible.
    Source: torchtune/training/memory.py register_optim_in_bwd_hooks (an optimizer per
    parameter; `optim_dict[p].step(); optim_dict[p].zero_grad()` in a post-accumulate-grad
    hook).
    """
    sharded = x.zero >= ZERO_GRADIENTS
    largest = np.max(
        np.stack(
            [
                np.broadcast_to(np.where(sharded, p.numel, f.numel), x.dp.shape)
                for f, p in zip(x.full, x.part, strict=True)
            ]
        ),
        axis=0,
    )
    largest_grad = np.where(x.lora, 0.0, largest * grad_e)
    return {
        **s,
        "gradients": np.where(in_backward, largest_grad, s["gradients"]),
        "optimizer_step_temporaries": np.where(in_backward, 0.0, s["optimizer_step_temporaries"]),
    }
