"""Activation terms of one micro-batch on one rank, and the loss/backward transients.

Evaluated once per distinct micro-batch shape and layout (see _factorize.per_key). The assembly
only: the formulas are in engine/_activations.py (op by op) and in one module per technique
(_recompute, _loss, _pipeline, _tensor_parallel, _context_parallel, _expert_parallel, _offload,
_lora, _precision).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _activations as act
from ._codes import (
    BNB_LEGACY,
    COMPILE_BLOCKS_AND_LOSS,
    COMPILE_NONE,
    EAGER,
    FLASH,
    LOSS_CHUNKED,
    LOSS_CHUNKED_HEAD,
    LOSS_CHUNKED_OUTPUT,
    LOSS_FULL,
    LOSS_VOCAB_PARALLEL,
    RECOMPUTE_FULL,
    RECOMPUTE_NONE,
    RECOMPUTE_SELECTIVE,
    RECOMPUTE_SELECTIVE_LAYER,
    RECOMPUTE_SELECTIVE_OP,
)
from ._compile import compiled_mlp_delta_bytes, compiled_op_sac_delta_bytes
from ._context_parallel import ring_buffer_bytes
from ._data_parallel import is_fsdp2
from ._expert_parallel import all_to_all_buffer_bytes, routed_rows
from ._frameworks import (
    ADAPTERS_IN_PARAM_DTYPE,
    CHECKPOINT_KEEPS_MASK,
    EAGER_SCORES_GLOBAL_BUFFER,
    EAGER_SOFTMAX_FUSED,
    FSDP2_CASTS_FP32_ADAPTERS,
    FULL_RECOMPUTE_TOP_MOMENT,
    FUSED_QKV,
    FUSED_RMS_NORM,
    GQA_KV_EXPANDED,
    LOGITS_CAST_FP32,
    LOGITS_UPCAST_IN_MODEL,
    LORA_DROPOUT,
    LORA_QKV_ZERO_PAD,
    LOSS_LOGITS_IN_PLACE,
    LOSS_PARALLEL_FP32_TENSORS,
    LOSS_SOFTMAX_IN_PLACE,
    MEGATRON_CORE_BLOCKS,
    NORM_INPUT_FP32,
    NORM_SCALE_FP32,
    O_PROJ_INPUT_KEPT,
    QLORA_BITSANDBYTES,
    QLORA_EVERY_LINEAR,
    QLORA_KBIT_PREPARED,
    ROPE_BUFFERS_FP32,
    ROPE_CACHE_PER_BLOCK,
    TRANSFORMERS_MODEL_CODE,
    head_chunk_tokens,
    loss_policy,
    recompute_policy,
    state_shard_degree,
)
from ._lora import (
    adapters_in_compute_dtype,
    bnb_kept_head_input_bytes,
    bnb_kept_input_bytes,
    kbit_activation_precision,
    kbit_prepared_rows,
    lora_activation_delta_bytes,
    lora_first_layer_unsaved_copy_bytes,
    lora_frozen_norm_bytes,
    lora_frozen_qk_norm_bytes,
    lora_module_extra_bytes,
    lora_unadapted_o_proj_bytes,
    qlora_head_copy_bytes,
    qlora_kbit_activation_delta_bytes,
    sharded_qlora_adapters_16bit,
    target_bits,
)
from ._loss import (
    head_chunked_loss_bytes,
    largest_loss_block_bytes,
    loop_held_step_logits_bytes,
    loss_forward_extra_bytes,
    loss_gradient_bytes,
    outside_layers_bytes,
    wrapper_loss_bytes,
)
from ._model import ModelSpec
from ._offload import offloaded_activation_bytes
from ._pipeline import (
    STAGE_ONLY,
    block_counts,
    held_logits_bytes,
    receive_buffer_bytes,
    stage_flags,
)
from ._precision import (
    COMPUTE_BYTES,
    IS_AMP,
    IS_MIXED,
    PARAM_BYTES,
    RESIDUAL_BYTES,
    autocast_weight_copy_bytes,
)
from ._rank_activation_profile import profile_activation_terms
from ._recompute import (
    attention_core_bytes,
    checkpointed_layers,
    eager_softmax_backward_bytes,
    op_sac_down_kept,
    op_sac_saved_bytes,
    op_sac_top_block_bytes,
    recompute_excess_bytes,
    saved_blocks_bytes,
    single_stage_recompute_delta,
)
from ._tensor_parallel import loss_tp_divisor, sequence_parallel_divisor
from ._vision_lora import (
    projector_lora_saved_bytes,
    tower_adapted,
    tower_lora_copy_bytes,
    tower_lora_targets,
)
from ._vision_memory import (
    cross_attention_saved_bytes,
    image_block_masked,
    language_seq_len,
    projector_saved_bytes,
    tower_autocast_copy_bytes,
    tower_frozen_casts,
    tower_sequence,
    tower_spec,
    vision_trainable,
)

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

BNB_COMPUTE_BYTES = 2.0
"""The 4-bit linears' compute dtype, in which bitsandbytes <= 0.43.1 keeps their inputs: 16-bit
(transformers' bnb_4bit_compute_dtype bf16 / fp16; Lightning's BitsandbytesPrecision bf16-true)
whatever dtype the residual stream has (peft's kbit preparation leaves it fp32). Traced:
tests/data/framework_traces/hf_qlora_old_bnb.json (the bf16 case's fp32 stream)."""

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
    "recompute_every",
    "compile",
    "framework",
    "stage_pos",
    "lora_rank",
    "lora_targets",
    "qlora",
    "bitsandbytes_version",
    "lora_zero3",
    "loss",
    "activation_offload",
    "zero",
    "dp",
    "dp_shard",
    "images_per_sample",
    "image_size",
    "freeze_vision",
    "lora_scope",
)
"""zero, dp, dp_shard: FSDP2's part in torchtitan's chunked loss (wrapper_loss_bytes)."""


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
    """The attention materialises its s x s scores (any attention code but flash)."""
    softmax_fused: np.ndarray
    """Eager attention's masked softmax is a fused 16-bit kernel (FrameworkSpec
    eager_softmax_fused, `--attention eager`, and the kernel's shape limits)."""
    fw: np.ndarray
    rc: np.ndarray
    """The recompute policy the rows run (`selective` resolved per framework)."""
    every: np.ndarray
    fused_norm: np.ndarray
    """Norms keep their input and rstd only (torch's fused RMSNorm, or any norm compiled)."""
    fused_qkv: np.ndarray
    norm_fp32_input: np.ndarray
    gqa_kv_expanded: np.ndarray
    adapters_in_param_dtype: np.ndarray
    compiled: np.ndarray
    compiled_loss: np.ndarray
    """The loss is one fused kernel on the logits (compiled, or the framework's own fused loss:
    FrameworkSpec.loss_logits_in_place), keeping the 16-bit logits and a logsumexp."""
    loss_grad_in_place: np.ndarray
    """That fused loss writes the logits' gradient into the kept logits (no new tensor)."""
    fp32_logits_in: np.ndarray
    """A compiled loss receives fp32 logits (the model upcasts them; not when chunked)."""
    num_checkpointed: np.ndarray
    """Blocks of the stage checkpointed whole (full: all; selective-layer: every N-th)."""
    first: np.ndarray
    last: np.ndarray
    counts: dict[str, np.ndarray]
    loss_tp_div: np.ndarray
    rank: np.ndarray
    lora: np.ndarray
    qlora: np.ndarray
    kbit_prepared: np.ndarray
    """QLoRA rows whose stack prepares the model for k-bit training (FrameworkSpec
    qlora_kbit_prepared)."""
    bnb_keeps_input: np.ndarray
    """QLoRA rows on bitsandbytes <= 0.43.1 (`--bitsandbytes-version legacy`, a stack whose NF4
    base is bitsandbytes): each frozen 4-bit linear keeps its input (bnb_kept_input_bytes)."""
    head_quantised: np.ndarray
    """The stack's QLoRA quantises the head too (FrameworkSpec.qlora_every_linear)."""
    bits: dict[str, np.ndarray]
    chunked: np.ndarray
    chunked_output: np.ndarray
    chunked_head: np.ndarray
    """torchtitan's ChunkedLossWrapper runs (`--loss chunked-head`, or auto on torchtitan); with
    `--compile blocks+loss` (its per-chunk loss compiled) counted as the eager wrapper."""
    fsdp2: np.ndarray
    shard_dp: np.ndarray
    """Ranks that shard the model states (state_shard_degree)."""
    rope_cache_per_block: np.ndarray
    head_chunked: np.ndarray
    """The framework's own loss over head chunks (FrameworkSpec.head_chunk_tokens) runs."""
    head_chunk_tokens: np.ndarray
    lora_dropout: np.ndarray
    lora_qkv_zero_pad: np.ndarray
    norm_scale_fp32: np.ndarray
    rope_buffers_fp32: np.ndarray
    o_proj_input_kept: np.ndarray
    logits_cast_fp32: np.ndarray
    """The training loop's wrapper casts the chunked head's logits to fp32
    (FrameworkSpec.logits_cast_fp32)."""
    step_logits_held: np.ndarray
    """The loop holds one head's whole fp32 logits through the optimizer step (the wrapper's
    cast, no head chunks, the full loss: loop_held_step_logits_bytes)."""
    capacity: np.ndarray
    softmax_in_place_loss: np.ndarray
    """The cross entropy's softmax and gradient live in its one fp32 copy (FrameworkSpec
    loss_softmax_in_place)."""
    activation_offload: np.ndarray
    zero_col: np.ndarray
    image_masked: np.ndarray
    """Every layer takes a mask for the images (Gemma 3 with images: image_block_masked)."""


def _kbit_prepared_and_precision(
    c: dict[str, np.ndarray], fw: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The QLoRA rows prepared for k-bit training (kbit_prepared_rows) and the activations'
    precision code they run at (kbit_activation_precision)."""
    prepared_rows = kbit_prepared_rows(QLORA_KBIT_PREPARED[fw], zero=c["zero"])
    kbit_prepared = c["qlora"] & (c["lora_rank"] > 0) & prepared_rows
    return kbit_prepared, kbit_activation_precision(c["precision"], prepared=kbit_prepared)


def micro_batch(m: ModelSpec, c: dict[str, np.ndarray]) -> MicroBatch:
    """The symbols of the rows `c` (per-key columns), bound once."""
    fw, loss = c["framework"].astype(np.int64), loss_policy(c["framework"], c["loss"])
    kbit_prepared, prec = _kbit_prepared_and_precision(c, fw)
    tp, sp, cp = c["tp"].astype(np.float64), c["sp"], c["cp"].astype(np.float64)
    b, s = c["micro_batch_size"].astype(np.float64), language_seq_len(m, c)
    T = b * s / cp  # tokens per rank
    first, last = stage_flags(c)
    rank = c["lora_rank"].astype(np.float64)
    rc = recompute_policy(fw, c["recompute"])
    every = c["recompute_every"].astype(np.float64)
    counts = block_counts(m, c)
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
        eager=c["attention"] != FLASH,
        softmax_fused=_softmax_fused(m, c, s=s / cp, b=b, tp=tp, e=COMPUTE_BYTES[prec]),
        fw=fw,
        rc=rc,
        every=every,
        fused_norm=FUSED_RMS_NORM[fw] | (c["compile"] != COMPILE_NONE),
        fused_qkv=FUSED_QKV[fw],
        norm_fp32_input=NORM_INPUT_FP32[fw] & (c["compile"] == COMPILE_NONE),
        gqa_kv_expanded=GQA_KV_EXPANDED[fw],
        adapters_in_param_dtype=ADAPTERS_IN_PARAM_DTYPE[fw]
        | adapters_in_compute_dtype(FSDP2_CASTS_FP32_ADAPTERS[fw], c["lora_zero3"], IS_MIXED[prec])
        | sharded_qlora_adapters_16bit(QLORA_KBIT_PREPARED[fw], qlora=c["qlora"], zero=c["zero"]),
        compiled=c["compile"] != COMPILE_NONE,
        **_loss_fields(fw, c, loss),
        num_checkpointed=checkpointed_layers(rc, num_layers=counts["layer"], every=every),
        first=first,
        last=last,
        counts=counts,
        loss_tp_div=loss_tp_divisor(fw, tp, loss),
        rank=rank,
        lora=rank > 0,
        qlora=c["qlora"] & (rank > 0),
        kbit_prepared=kbit_prepared,
        bits=target_bits(c["lora_targets"]),
        **_stack_fields(fw, c, loss),
        capacity=c["capacity_factor_pct"].astype(np.float64) / 100.0,
        activation_offload=c["activation_offload"],
        zero_col=np.zeros_like(T),
        image_masked=image_block_masked(m, c) & np.ones_like(T, dtype=bool),
    )


def _loss_fields(fw: np.ndarray, c: dict[str, np.ndarray], loss: np.ndarray) -> dict[str, Any]:
    """MicroBatch's loss kinds (`loss`: the resolved loss): compiled or the framework's own fused
    loss on the 16-bit logits (FrameworkSpec.loss_logits_in_place, which writes its gradient
    into them), fp32 logits from the model, chunked, chunked-output, an in-place softmax."""
    fused_in_place = LOSS_LOGITS_IN_PLACE[fw] & (loss == LOSS_FULL)
    return {
        "compiled_loss": ((c["compile"] == COMPILE_BLOCKS_AND_LOSS) | fused_in_place)
        & (loss != LOSS_CHUNKED_HEAD),
        "loss_grad_in_place": fused_in_place,
        "fp32_logits_in": LOGITS_UPCAST_IN_MODEL[fw] & (loss != LOSS_CHUNKED_OUTPUT),
        "chunked": loss == LOSS_CHUNKED,
        "chunked_output": loss == LOSS_CHUNKED_OUTPUT,
        "softmax_in_place_loss": LOSS_SOFTMAX_IN_PLACE[fw] | (loss == LOSS_VOCAB_PARALLEL),
    }


def _stack_fields(fw: np.ndarray, c: dict[str, np.ndarray], loss: np.ndarray) -> dict[str, Any]:
    """MicroBatch's per-framework fields (engine/_frameworks.py: LitGPT's behaviour, torchtitan's
    loss wrapper and RoPE caches; `loss`: the resolved loss); LitGPT's head-chunked loss runs in
    place of `--loss full`, not when the loss is compiled."""
    chunk_tokens = head_chunk_tokens(fw, c["lora_rank"])
    own_full_loss = (loss == LOSS_FULL) & (c["compile"] != COMPILE_BLOCKS_AND_LOSS)
    return {
        "chunked_head": loss == LOSS_CHUNKED_HEAD,
        "fsdp2": is_fsdp2(fw, c["zero"]),
        "shard_dp": state_shard_degree(c["dp"], c["cp"], c["dp_shard"]),
        "rope_cache_per_block": ROPE_CACHE_PER_BLOCK[fw],
        "head_chunked": (chunk_tokens > 0) & own_full_loss,
        "head_chunk_tokens": chunk_tokens,
        "step_logits_held": LOGITS_CAST_FP32[fw] & (chunk_tokens == 0) & own_full_loss,
        "lora_dropout": LORA_DROPOUT[fw],
        "lora_qkv_zero_pad": LORA_QKV_ZERO_PAD[fw] & FUSED_QKV[fw],
        "norm_scale_fp32": NORM_SCALE_FP32[fw],
        "rope_buffers_fp32": ROPE_BUFFERS_FP32[fw],
        "o_proj_input_kept": O_PROJ_INPUT_KEPT[fw],
        "logits_cast_fp32": LOGITS_CAST_FP32[fw],
        "bnb_keeps_input": c["qlora"]
        & (c["lora_rank"] > 0)
        & QLORA_BITSANDBYTES[fw]
        & (c["bitsandbytes_version"] == BNB_LEGACY),
        "head_quantised": QLORA_EVERY_LINEAR[fw],
    }


def _softmax_fused(m: ModelSpec, c: dict[str, np.ndarray], *, s, b, tp, e) -> np.ndarray:
    """Rows whose eager attention runs the fused 16-bit softmax kernel (MicroBatch)."""
    runs = act.megatron_fused_softmax_runs(
        s=s, b=b, heads_per_rank=m.num_attention_heads / tp, sixteen_bit=e < 4
    )
    fw = c["framework"].astype(np.int64)
    return (c["attention"] == EAGER) & EAGER_SOFTMAX_FUSED[fw] & runs


def megatron_score_buffer_bytes(m: ModelSpec, x: MicroBatch) -> np.ndarray:
    """megatron-core's unfused core attention computes its scores into one [b a/t, s, s]
    16-bit buffer of parallel_state's GlobalMemoryBuffer, made at the first forward and kept for
    the run (every phase; where FrameworkSpec.eager_scores_global_buffer). Source:
    megatron/core/transformer/dot_product_attention.py
    (get_global_memory_buffer().get_tensor(..., "mpu")); traced:
    tests/data/framework_traces/megatron_gpt_local.json (global_memory_buffer_bytes)."""
    a_r = m.num_attention_heads / x.tp
    scores = x.e * a_r * (x.s / x.cp) * x.s * x.b
    return np.where(EAGER_SCORES_GLOBAL_BUFFER[x.fw] & x.eager, scores, 0.0)


def _block_parts(m: ModelSpec, x: MicroBatch, *, moe: bool, bnb_layer: np.ndarray):
    """(full block bytes, attention core, MLP bytes, bytes kept under per-op SAC) for a dense
    or an MoE block (MLA and MoE blocks: their full bytes under per-op SAC, see
    op_sac_saved_bytes); `bnb_layer`: what legacy bitsandbytes keeps of it (_bnb_kept_per_layer)."""
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
        block = _dense_block(m, x)
        dense_mlp = act.hf_mlp_bytes(m, T=T, e=e, amp=amp, tp=tp)
    block = block + act.hf_qk_norm_bytes(m, T=T, r=r, tp=tp)
    mlp = dense_mlp
    if moe:
        e_expert = np.where(amp, 4.0, e)
        mlp = act.hf_moe_bytes(
            m, T=T, e=e, e_expert=e_expert, amp=amp, etp=x.etp, capacity=x.capacity
        )
        block = block - dense_mlp + mlp
    core = attention_core_bytes(
        m, T=T, s=s, e=e, tp=tp, eager=eager, amp=amp, transformers=TRANSFORMERS_MODEL_CODE[x.fw]
    )
    delta = lora_activation_delta_bytes(
        m,
        T=T,
        e=e,
        amp=amp,
        tp=tp,
        rank=x.rank,
        mask=None,
        adapted_bits=x.bits,
        in_param_dtype=x.adapters_in_param_dtype,
        frozen_casts=tower_frozen_casts(m),
    )
    delta = delta + _lora_module_extra(m, x) - _lora_frozen_saves_less(m, x)
    delta = delta + qlora_kbit_activation_delta_bytes(
        m, T=T, tp=tp, amp=amp, o_adapted=x.bits["o_proj"], prepared=x.kbit_prepared
    )
    delta = delta + bnb_layer
    block = np.where(x.lora, block + delta, block)
    if m.is_mla or moe:
        return block, core, mlp, block
    op_saved = op_sac_saved_bytes(
        m, T=T, s=s, e=e, r=r, tp=tp, sp=x.sp, eager=eager, fused_qkv=x.fused_qkv
    )
    op_saved = np.where(x.lora, op_saved + delta, op_saved)
    block, op_saved = _compiled(m, x, block, op_saved)
    return block, core, mlp, op_saved


def _bnb_kept_per_layer(m: ModelSpec, x: MicroBatch, *, qkv_grad: Any = True) -> np.ndarray:
    """One block's 4-bit linear inputs kept by bitsandbytes <= 0.43.1 (bnb_kept_input_bytes):
    o_proj's aliases its adapter's saved input where lora_A gets it as it is (no dropout, the
    compute dtype)."""
    in_compute_dtype = x.amp | ~x.kbit_prepared
    o_aliased = x.bits["o_proj"] & ~x.lora_dropout & in_compute_dtype
    return bnb_kept_input_bytes(
        m,
        T=x.T,
        e=BNB_COMPUTE_BYTES,
        tp=x.tp,
        keeps=x.bnb_keeps_input,
        separate_qkv=~x.fused_qkv,
        per_linear_casts=x.kbit_prepared,
        o_aliased=o_aliased,
        qkv_grad=qkv_grad,
    )


def _bnb_kept_blocks(m: ModelSpec, x: MicroBatch) -> tuple[np.ndarray, np.ndarray]:
    """(one block's kept inputs, the stage's extra: _bnb_stage_extra), evaluated once."""
    per_layer = _bnb_kept_per_layer(m, x)
    return per_layer, _bnb_stage_extra(m, x, per_layer)


def _bnb_stage_extra(m: ModelSpec, x: MicroBatch, per_layer: np.ndarray) -> np.ndarray:
    """What bitsandbytes <= 0.43.1 keeps on the stage beyond the non-checkpointed blocks'
    per-layer share: less q/k/v's on a peft-prepared first block that no checkpoint made
    require grad. A checkpointed block keeps nothing in forward: the stacks of that
    bitsandbytes checkpointed reentrantly (transformers < 5 passed use_reentrant=True,
    torch.utils.checkpoint's default before 2.4), forward under no_grad; its recomputation,
    which backward then runs through, keeps them (the block's layer_full)."""
    no_grad = x.first & x.kbit_prepared & (x.num_checkpointed == 0)
    return _bnb_kept_per_layer(m, x, qkv_grad=~no_grad) - per_layer


def _bnb_kept_stage(
    m: ModelSpec, x: MicroBatch, layers: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(every kept input of the stage: its blocks' and the 4-bit head's; that of one block; the
    previous step's, in this forward): what bitsandbytes <= 0.43.1 keeps with the graph
    (bnb_kept_input_bytes; `layers`' bnb_layer and bnb_extra), alive to the end of backward
    (the embedding's included) and, where the loop holds the logits and so the graph (LitGPT),
    through the optimizer step into the next forward."""
    per_layer = layers["bnb_layer"]
    blocks = np.maximum(x.counts["layer"] - x.num_checkpointed, 0.0)
    extra = np.where(blocks > 0, layers["bnb_extra"], 0.0)
    kept = per_layer * blocks + extra + _bnb_kept_head(m, x, last=x.last)
    prev_graph = np.where(x.head_chunked | x.step_logits_held, kept, 0.0)
    return kept, np.where(blocks > 0, per_layer, 0.0), prev_graph


def _bnb_kept_head(m: ModelSpec, x: MicroBatch, *, last) -> np.ndarray:
    """The 4-bit head's input bitsandbytes <= 0.43.1 keeps (bnb_kept_head_input_bytes)."""
    return bnb_kept_head_input_bytes(
        m,
        T=x.T,
        e=BNB_COMPUTE_BYTES,
        keeps=x.bnb_keeps_input,
        head_quantised=x.head_quantised,
        last=last,
    )


def _lora_module_extra(m: ModelSpec, x: MicroBatch) -> np.ndarray:
    """LitGPT's adapter modules: dropout and the fused q/k/v padding (lora_module_extra_bytes)."""
    return lora_module_extra_bytes(
        m,
        T=x.T,
        e=x.e,
        tp=x.tp,
        amp=x.amp,
        adapted_bits=x.bits,
        dropout=x.lora_dropout,
        qkv_one_module=x.fused_qkv,
        qkv_zero_pad=x.lora_qkv_zero_pad,
        o_kept=x.o_proj_input_kept,
    )


def _lora_frozen_saves_less(m: ModelSpec, x: MicroBatch) -> np.ndarray:
    """A LoRA block's frozen norms and unadapted o_proj: what they no longer save."""
    norms = lora_frozen_norm_bytes(
        m,
        T=x.T,
        r=x.r,
        fused_norm=x.fused_norm,
        num_norms=m.num_norms_per_layer,
        scale_fp32=x.norm_scale_fp32,
        sp_div=x.sp_div,
    )
    o_proj = lora_unadapted_o_proj_bytes(
        m, T=x.T, e=x.e, tp=x.tp, o_adapted=x.bits["o_proj"] | x.o_proj_input_kept
    )
    return norms + o_proj + lora_frozen_qk_norm_bytes(m, T=x.T, tp=x.tp)


def _dense_block(m: ModelSpec, x: MicroBatch) -> np.ndarray:
    """A dense (non-MLA) block's saved bytes without recomputation, the framework's norms and
    attention included: torchtune expands k and v to every query head before the kernel, which
    keeps them at [T, q] (FrameworkSpec.gqa_kv_expanded)."""
    T, e, tp = x.T, x.e, x.tp
    # transformers' own model code (FrameworkSpec.transformers_model_code): its SDPA path
    # passes unequal heads, its GPT-2 / BERT eager softmax runs in the scores' dtype
    transformers = TRANSFORMERS_MODEL_CODE[x.fw]
    block = act.hf_layer_bytes(
        m,
        T=T,
        s=x.s,
        e=e,
        r=x.r,
        amp=x.amp,
        tp=tp,
        sp=x.sp,
        eager=x.eager,
        fused_norm=x.fused_norm,
        norm_fp32_input=x.norm_fp32_input,
        enable_gqa=transformers,
        transformers=transformers,
        norm_scale_fp32=x.norm_scale_fp32,
        image_masked=x.image_masked,
    )
    expanded = 2.0 * e * T * (m.q_dim - m.kv_dim) / tp
    return block + np.where(x.gqa_kv_expanded & ~x.eager, expanded, 0.0)


def _compiled(m: ModelSpec, x: MicroBatch, block, op_saved) -> tuple[np.ndarray, np.ndarray]:
    """A dense block's saved bytes without and under per-op SAC, where torch.compile runs the
    block: what the partitioner keeps instead (engine/_compile.py)."""
    compiled_mlp = compiled_mlp_delta_bytes(m, T=x.T, e=x.e, amp=x.amp, tp=x.tp)
    down_kept = op_sac_down_kept(m, fused_qkv=x.fused_qkv)
    op_delta = compiled_op_sac_delta_bytes(m, T=x.T, e=x.e, policy=x.rc, down_kept=down_kept)
    return (
        np.where(x.compiled, block + compiled_mlp, block),
        np.where(x.compiled, op_saved + op_delta, op_saved),
    )


def _megatron_layers(m: ModelSpec, x: MicroBatch) -> tuple[np.ndarray, ...]:
    """Megatron's stage under its formulas (Korthikanti et al., act.megatron_layer_bytes): the
    stage's saved bytes under the policy (selective-layer: the checkpointed blocks keep their
    input), one layer without recompute, and the attention core selective drops."""
    num_layers = x.counts["layer"]
    shape = {
        "s": x.s / x.cp,
        "b": x.b,
        "tp": x.tp,
        "sp": x.sp,
        "eager": x.eager,
        "softmax_bytes": act.megatron_softmax_bytes(fused=x.softmax_fused, e=x.e),
    }
    layer_mg = act.megatron_layer_bytes(m, **shape, recompute_code=x.rc)
    layer_none = act.megatron_layer_bytes(m, **shape, recompute_code=RECOMPUTE_NONE)
    layer_full = act.megatron_layer_bytes(m, **shape, recompute_code=RECOMPUTE_FULL)
    layer_core = act.megatron_layer_bytes(m, **shape, recompute_code=RECOMPUTE_SELECTIVE)
    stage = np.where(
        x.rc == RECOMPUTE_SELECTIVE_LAYER,
        layer_none * (num_layers - x.num_checkpointed) + layer_full * x.num_checkpointed,
        layer_mg * num_layers,
    )
    return stage, layer_none, layer_none - layer_core


def _core_moments(m: ModelSpec, x: MicroBatch, *, megatron, mg_core, core, ckpt) -> dict:
    """The attention core's backward moments of the top layer (_layers)."""
    # The softmax backward's gradient over the scores: fp32 on the torch path, 16-bit from the
    # fused kernel (megatron-core 0.16.1 fusions/fused_softmax.py).
    softmax_grad = np.where(x.softmax_fused, x.e, 4.0) * m.num_attention_heads / x.tp * x.s * x.T
    return {
        # What selective brings back per layer while its backward runs: the attention core
        # (Megatron's own terms) and, with materialised scores, the softmax backward's fp32
        # gradient over them (and Megatron's recomputed causal mask); the fused 16-bit softmax
        # kernel's backward writes a 16-bit gradient and needs no mask. Source: the traced
        # megatron-core steps (tests/data/framework_traces/megatron_gpt_local.json);
        # megatron-core 0.16.1 fusions/fused_softmax.py ScaledUpperTriangMaskedSoftmax.backward.
        "core_recomputed": np.where(megatron, mg_core, core)
        + np.where(
            x.eager,
            softmax_grad + np.where(megatron & ~x.softmax_fused, (x.s / x.cp) * x.s, 0.0),
            0.0,
        ),
        # Megatron without recompute: the top layer's attention core in its backward, its
        # saved tensors stored already, with the softmax backward's gradient (the same moment
        # as selective's, nothing recomputed); -inf where it does not apply.
        "core_backward": np.where(
            megatron & x.eager & (x.rc == RECOMPUTE_NONE), softmax_grad, -np.inf
        ),
        "softmax_at_work": _softmax_at_work(m, x, megatron=megatron, layer_ckpt=ckpt),
    }


def _block_work(mlp_moment, softmax_moment) -> np.ndarray:
    """A block's backward working set (layer 0's at the end of backward, or the top block's
    under full recompute): the MLP backward's moment (_backward_transients) or, where larger,
    the eager softmax backward's (_softmax_at_work)."""
    return np.maximum(mlp_moment, softmax_moment)


def _layers(m: ModelSpec, x: MicroBatch) -> dict[str, np.ndarray]:
    """The blocks of the stage: one layer's bytes (layer 0: dense when the stage holds a dense
    block), its attention core and checkpointed input, the stage's saved bytes under the
    recompute policy (Megatron: Korthikanti et al.), and what one recomputed layer brings back."""
    num_mlp, num_moe, num_layers = x.counts["mlp"], x.counts["moe"], x.counts["layer"]
    bnb_layer, bnb_extra = _bnb_kept_blocks(m, x)
    dense_block, core, _, dense_op = _block_parts(m, x, moe=False, bnb_layer=bnb_layer)
    if m.is_moe:
        moe_block, _, _, moe_op = _block_parts(m, x, moe=True, bnb_layer=bnb_layer)
    else:
        moe_block = moe_op = x.zero_col
    layer_full = np.where(num_mlp > 0, dense_block, moe_block)
    layer_ckpt = act.hf_checkpointed_layer_bytes(m, T=x.T, r=x.r, tp=x.tp, sp=x.sp)
    # Per-op SAC keeps at least the block's checkpointed input: a LoRA block's net delta (the
    # frozen linears' inputs it no longer saves) cannot take its saved set below that.
    dense_op = np.where(x.lora, np.maximum(dense_op, layer_ckpt), dense_op)
    op_stage = num_mlp * dense_op + num_moe * moe_op
    stage_hf = saved_blocks_bytes(
        x.rc,
        blocks=num_mlp * dense_block + num_moe * moe_block,
        core=core,
        checkpointed=layer_ckpt,
        num_layers=num_layers,
        op_saved=op_stage,
        num_checkpointed=x.num_checkpointed,
    )
    stage_mg, layer_mg_none, mg_core = _megatron_layers(m, x)
    # Megatron's own formulas (FrameworkSpec.megatron_core_blocks) cover none, selective (core)
    # and full; per-op SAC is counted op by op as for every framework.
    megatron = MEGATRON_CORE_BLOCKS[x.fw] & (x.rc != RECOMPUTE_SELECTIVE_OP)
    stage_layers = np.where(megatron, stage_mg, stage_hf) + bnb_extra
    op_layer = np.where(num_mlp > 0, dense_op, moe_op)
    recomputed = np.where(
        x.rc == RECOMPUTE_SELECTIVE_OP,
        np.maximum(layer_full - (op_layer - layer_ckpt), 0.0),
        np.where(megatron, layer_mg_none, layer_full),
    )
    return {
        "core": core,
        "layer_full": layer_full,
        "layer_ckpt": layer_ckpt,
        "stage_layers": stage_layers,
        "bnb_layer": bnb_layer,
        "bnb_extra": bnb_extra,
        "per_layer": stage_layers / np.maximum(num_layers, 1.0),
        "layer_recomputed": recomputed,
        "top_saved": np.where(x.rc == RECOMPUTE_SELECTIVE_OP, op_layer, layer_ckpt),
        # A dense stage's top block at work under per-op SAC, where the blocks' norms are the
        # fused kernel on their own input (torchtitan's blocks, op_sac_top_block_bytes); else
        # (MoE, MLA, Python RMSNorms) layer 0's end-of-backward set stands for it.
        "op_top_dense": (num_moe == 0)
        & (not m.is_mla)
        & (x.rc == RECOMPUTE_SELECTIVE_OP)
        & x.fused_norm
        & ~x.norm_fp32_input,
        "op_top_work": op_sac_top_block_bytes(
            m, T=x.T, e=x.e, r=x.r, tp=x.tp, sp=x.sp, fused_qkv=x.fused_qkv, top_saved=dense_op
        ),
        **_core_moments(m, x, megatron=megatron, mg_core=mg_core, core=core, ckpt=layer_ckpt),
    }


def _softmax_at_work(m: ModelSpec, x: MicroBatch, *, megatron, layer_ckpt) -> np.ndarray:
    """A fully recomputed block of transformers' Llama-style eager attention at its softmax
    backward, its checkpointed input kept apart as act_top / act_end keep it
    (eager_softmax_backward_bytes); -inf elsewhere (flash, Megatron's blocks, GPT-2 / BERT's
    16-bit softmax, Falcon's own path, attention dropout)."""
    llama_style = (m.family not in ("gpt2", "bert")) & (m.model_type != "falcon")
    applies = (
        x.eager & ~megatron & (x.rc == RECOMPUTE_FULL) & llama_style & (m.attention_dropout == 0)
    )
    work = eager_softmax_backward_bytes(m, T=x.T, s=x.s, tp=x.tp, e=x.e, applies=applies)
    return work + np.where(x.r < 4, layer_ckpt, 0.0)


def _lora_frozen_final_norm(m: ModelSpec, x: MicroBatch) -> np.ndarray:
    """What LoRA's frozen final norm no longer saves (lora_frozen_norm_bytes), on LoRA rows."""
    final_norm = lora_frozen_norm_bytes(
        m,
        T=x.T,
        r=x.r,
        fused_norm=x.fused_norm,
        num_norms=1,
        scale_fp32=x.norm_scale_fp32,
        sp_div=x.sp_div,
    )
    return np.where(x.lora, final_norm, 0.0)


def _checkpointed_masks(m: ModelSpec, x: MicroBatch) -> np.ndarray:
    """The attention masks checkpointed blocks keep (act.hf_checkpointed_mask_bytes)."""
    return act.hf_checkpointed_mask_bytes(
        m, T=x.T, s=x.s / x.cp, r=x.r, eager=x.eager, image_masked=x.image_masked
    )


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
    checkpointing = (x.num_checkpointed > 0) | (x.rc == RECOMPUTE_SELECTIVE_OP)
    rope = 2.0 * s * m.rotary_dim * r * m.num_rotary_tables if m.rotary else 0.0
    head = _head_chunked(m, x)
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
        fused_norm=x.fused_norm,
        compiled=x.compiled_loss & (x.pp <= 1),
        fp32_logits_in=x.fp32_logits_in,
        norm_fp32_input=x.norm_fp32_input,
        norm_scale_fp32=x.norm_scale_fp32,
        head=head,
    )
    logits_held = held_logits_bytes(
        m, T=T, e=e, pp=pp, chunked=x.chunked | x.chunked_head, loss_tp_div=x.loss_tp_div
    )
    outside_all, rope, run_held = _rope_buffers(m, x, outside_all, rope, held=head["held"])
    outside_all = outside_all - _lora_frozen_final_norm(m, x) + _bnb_kept_head(m, x, last=True)
    masks = np.where(checkpointing & CHECKPOINT_KEEPS_MASK[x.fw], _checkpointed_masks(m, x), 0.0)
    outside = np.where(x.last, outside_all + logits_held, rope) + masks
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
        "head": head,
        "run_held": run_held,
        "stage_act": stage_act - offloaded,
        "offloaded": offloaded,
    }


def _wrapper(m: ModelSpec, x: MicroBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """wrapper_loss_bytes of the rows (ChunkedLossWrapper), for every row (callers mask)."""
    return wrapper_loss_bytes(
        m,
        T=x.T,
        b=x.b,
        e=x.e,
        loss_tp_div=x.loss_tp_div,
        head_grad_e=np.where(x.fsdp2 & (IS_MIXED[x.prec] | x.amp), 4.0, PARAM_BYTES[x.prec]),
        dp=x.shard_dp,
        fsdp=x.fsdp2,
        head_trainable=~x.lora,
        lp_tensors=np.where(x.loss_tp_div > 1, LOSS_PARALLEL_FP32_TENSORS[x.fw], 0.0),
    )


def _rope_buffers(m: ModelSpec, x: MicroBatch, outside_all, rope, *, held) -> tuple:
    """(outside, rope, run_held): persistent fp32 rope buffers (FrameworkSpec.rope_buffers_fp32)
    or per-block complex caches (rope_cache_per_block, the stage's blocks) replace the
    per-forward tables; they and the training loop's held logits (last stage) are alive in
    every phase (`run_held`, counted with the small buffers)."""
    buffers = x.rope_buffers_fp32
    tables_gone = buffers | x.rope_cache_per_block  # the attention reads the buffers' slices
    outside_all = outside_all - np.where(tables_gone, act.rope_table_bytes(m, s=x.s, r=x.r), 0.0)
    run_held = np.where(buffers, act.rope_buffer_bytes(m, s=x.s), 0.0)
    run_held = run_held + np.where(
        x.rope_cache_per_block,
        act.rope_block_cache_bytes(m, s=x.s) * x.counts["layer"] / x.pp,
        0.0,
    )
    run_held = run_held + np.where(x.last & x.head_chunked, held, 0.0)
    return outside_all, np.where(tables_gone, 0.0, rope), run_held


def _head_chunked(m: ModelSpec, x: MicroBatch) -> dict[str, np.ndarray]:
    """The terms of a head run over chunks (head_chunked_loss_bytes), zero on other rows."""
    names = ("saved", "held", "forward", "backward", "block")
    terms = head_chunked_loss_bytes(
        m,
        T=x.T,
        b=x.b,
        e=x.e,
        amp=x.amp,
        chunk_tokens=x.head_chunk_tokens,
        loss_tp_div=x.loss_tp_div,
        cast_fp32=x.logits_cast_fp32,
    )
    out = {k: np.where(x.head_chunked, t, 0.0) for k, t in zip(names, terms, strict=True)}
    return {**out, "chunked": x.head_chunked, "wrapped": x.chunked_head}


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
    A k-bit-prepared QLoRA layer under autocast keeps its MLP tensors in fp32, so its MLP
    gradients are fp32 too (traced: tests/data/framework_traces/hf_qlora.json).
    """
    T, e, r, amp, h = x.T, x.e, x.r, x.amp, m.hidden_size
    layer_full, full = layers["layer_full"], x.rc == RECOMPUTE_FULL
    # Layer 0 runs under a checkpoint (its input kept apart from what it recomputes).
    layer0_checkpointed = (
        full
        | (x.rc == RECOMPUTE_SELECTIVE_OP)
        | ((x.rc == RECOMPUTE_SELECTIVE_LAYER) & (x.every <= 1))
    )
    is_moe0 = x.counts["mlp"] == 0
    f_r = np.where(is_moe0, m.moe_intermediate_size / x.etp, m.intermediate_size / x.tp)
    rows = np.where(is_moe0, routed, T)
    # fp32 MLP tensors (and so their gradients): an MoE layer under autocast, and a k-bit-
    # prepared QLoRA block under autocast (qlora_kbit_activation_delta_bytes).
    e_mlp = np.where((is_moe0 | x.kbit_prepared) & amp, 4.0, e)
    freed_mlp = (3.0 if m.gated_mlp else 1.0) * e_mlp * rows * f_r
    act_end = (
        layer_full
        - freed_mlp
        + rope
        + np.where(layer0_checkpointed & (r < 4), layers["layer_ckpt"], 0.0)
    )
    # A checkpointed top block at work: its input kept apart from what it recomputes.
    act_top = layer_full - freed_mlp + rope + np.where(r < 4, layers["layer_ckpt"], 0.0)
    temp_factor = np.where(is_moe0, BACKWARD_MOE_TEMP_SF, BACKWARD_MLP_TEMP_TF)
    temp_end = temp_factor * e_mlp * rows * f_r + (2.0 * r + np.where(amp, 2.0 * e, 0.0)) * T * h
    return {
        "act_end": act_end,
        "act_top": act_top,
        "temp_end": temp_end,
        "fwd_working": np.where(
            full, layer_full - FORWARD_WORKING_FREED_TF * e_mlp * rows * f_r, 0.0
        ),
        "temp_recompute": BACKWARD_MLP_TEMP_TF * e_mlp * rows * f_r + e * T * h,
        "work_end": _block_work(act_end + temp_end, layers["softmax_at_work"] + rope),
        "work_top": _block_work(act_top + temp_end, layers["softmax_at_work"] + rope),
    }


def _autocast_copies(
    m: ModelSpec, x: MicroBatch, *, full: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Autocast's weight copies (all, and those in the layers). A frozen LoRA base is cast per
    use, yet saved by each matmul whose input needs a gradient; so is QLoRA's unquantised head
    (its NF4 linears are dequantised per call and keep no copy)."""
    frozen_amp = x.amp & x.lora & ~x.qlora
    copies, copies_layers = autocast_weight_copy_bytes(
        m,
        amp=(x.amp & ~x.lora) | frozen_amp,
        last=x.last,
        tp=x.tp,
        num_layers=x.counts["layer"],
        num_mlp=x.counts["mlp"],
        num_moe=x.counts["moe"],
        full_recompute=full,
    )
    copies = copies - lora_first_layer_unsaved_copy_bytes(
        m, frozen_amp=frozen_amp, first=x.first, full=full, tp=x.tp
    )
    copies = copies + qlora_head_copy_bytes(m, amp=x.amp, qlora=x.qlora, last=x.last, tp=x.tp)
    return copies, copies_layers


def _copies_and_loss(
    m: ModelSpec, x: MicroBatch, out: dict[str, np.ndarray], *, full: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Autocast's weight copies (all, and those in the layers), the loss's forward extra and its
    gradients, for the rows of `x` (`out`: _outside's terms)."""
    T, e, pp, last = x.T, x.e, x.pp, x.last
    copies, copies_layers = _autocast_copies(m, x, full=full)
    kinds = {  # what kind of loss the rows run, for both loss terms (the wrapper's: a chunked one)
        "chunked": x.chunked | x.chunked_head,
        "chunked_output": x.chunked_output,
        "loss_tp_div": x.loss_tp_div,
        "zero_col": x.zero_col,
        "compiled": x.compiled_loss,
        "fp32_logits_in": x.fp32_logits_in,
        "softmax_in_place": x.softmax_in_place_loss,
        "head": out["head"],
    }
    loss_extra = loss_forward_extra_bytes(
        m,
        T=T,
        e=e,
        r=x.r,
        amp=x.amp,
        pp=pp,
        last=last,
        logits_held=out["logits_held"],
        chunk_transient=np.where(x.chunked_head, _wrapper(m, x)[0], out["chunk_transient"]),
        **kinds,
    )
    loss_grads = loss_gradient_bytes(
        m,
        T=T,
        e=e,
        pp=pp,
        last=last,
        sp_div=x.sp_div,
        grad_in_place=x.loss_grad_in_place,
        **kinds,
    )
    parallel_extra = _parallel_loss_extra(m, x)
    return copies, copies_layers, loss_extra + parallel_extra, loss_grads + parallel_extra


def _parallel_loss_extra(m: ModelSpec, x: MicroBatch) -> np.ndarray:
    """torchtitan's vocab-parallel loss: one more fp32 [T, v/tp] tensor than a plain cross
    entropy in its forward and in its backward (engine/_frameworks.py)."""
    return np.where(
        x.last
        & (x.loss_tp_div > 1)
        & ~x.chunked
        & ~x.chunked_head
        & ~x.compiled_loss
        & (x.pp <= 1),
        LOSS_PARALLEL_FP32_TENSORS[x.fw] * 4.0 * x.T * m.vocab_size / x.loss_tp_div,
        0.0,
    )


def _recompute_terms(
    x: MicroBatch, layers: dict, out: dict, bwd: dict, *, small
) -> dict[str, np.ndarray]:
    """What a recomputing stage holds: a pipeline stage's excess over its stored activations
    (recompute_excess) and the transients of a layer's recompute-and-backward moment
    (recompute_extra: pipelines under full recompute; a single stage under selective-op or
    selective-layer, whose top block recomputes while the others keep their tensors; a single
    Megatron stage without recompute at its top layer's attention-core backward, the loss's
    tensors freed: `core_backward`)."""
    full, multi, last = x.rc == RECOMPUTE_FULL, x.pp > 1, x.last
    # selective-layer with fewer blocks on the stage than `every` checkpoints none of them:
    # nothing recomputes (as without recompute)
    none_checkpointed = (x.rc == RECOMPUTE_SELECTIVE_LAYER) & (x.num_checkpointed == 0)
    return {
        "recompute_excess": recompute_excess_bytes(
            np.where(none_checkpointed, RECOMPUTE_NONE, x.rc),
            multi=multi,
            last=last,
            layer_recomputed=layers["layer_recomputed"],
            core=layers["core"],
            outside=out["outside"],
            rope=out["rope"],
            zero_col=x.zero_col,
        ),
        "recompute_extra": np.maximum(
            np.maximum(
                np.where(full & multi, small + bwd["temp_recompute"], -np.inf),
                np.where(multi, -np.inf, small + layers["core_backward"] - out["outside"]),
            ),
            small
            + single_stage_recompute_delta(
                x.rc,
                multi=multi,
                layer_at_work=np.select(
                    [x.rc == RECOMPUTE_SELECTIVE, layers["op_top_dense"]],
                    [layers["core_recomputed"], layers["op_top_work"]],
                    bwd["work_top"],
                ),
                top_saved=np.where(x.rc == RECOMPUTE_SELECTIVE, 0.0, layers["top_saved"]),
                outside=out["outside"],
                full_top=FULL_RECOMPUTE_TOP_MOMENT[x.fw],
            ),
        ),
    }


def _largest_block(m: ModelSpec, x: MicroBatch, head) -> np.ndarray:
    """The step's largest tensor on this stage (largest_loss_block_bytes; the wrapper's
    chunk block, wrapper_loss_bytes)."""
    block = largest_loss_block_bytes(
        m,
        T=x.T,
        e=x.e,
        last=x.last,
        chunked=x.chunked,
        chunked_output=x.chunked_output,
        compiled=x.compiled_loss & (x.pp <= 1),
        fp32_logits_in=x.fp32_logits_in,
        loss_tp_div=x.loss_tp_div,
        zero_col=x.zero_col,
        head=head,
    )
    block = np.where(x.last & x.chunked_head, _wrapper(m, x)[1], block)
    return np.maximum(block, eager_fp32_scores_bytes(m, x))


def eager_fp32_scores_bytes(m: ModelSpec, x: MicroBatch) -> np.ndarray:
    """One fp32 [b, a/tp, s, s] score tensor of a layer with materialised scores (eager
    attention, Llama-style fp32 softmax; attention_score_bytes_per_elem), where the row runs
    it: a candidate for the step's largest tensor (its softmax output, the upcast input, the
    gradients over it: tests/data/framework_traces/llama_recipes_fsdp1.json). 0 elsewhere.
    Source: transformers modeling_llama.py eager_attention_forward (softmax(dtype=float32)).
    Ignores: GPT-2 / BERT eager (16-bit softmax without autocast) and Megatron's own kernels,
    whose largest score tensor is the 16-bit one.
    """
    llama_style = (m.family not in ("gpt2", "bert")) & (m.model_type != "falcon")
    megatron = MEGATRON_CORE_BLOCKS[x.fw] & (x.rc != RECOMPUTE_SELECTIVE_OP)
    applies = x.eager & llama_style & ~megatron
    return np.where(applies, 4.0 * m.num_attention_heads / x.tp * x.s * x.T, 0.0)


def _checkpointed_copies(x: MicroBatch, copies_layers: np.ndarray, *, full) -> np.ndarray:
    """The layers' autocast casts alive in a full-recompute forward: only what autocast caches.

    Source: aten/src/ATen/autocast_mode.cpp cached_cast (trainable fp32 leaves only): a frozen
    LoRA base is cast per use inside the checkpointed block's forward and freed with it (traced:
    tests/unit/trace/test_lora_trace.py, llama-3.2-1b dims at amp-bf16, recompute full).
    """
    return np.where(x.amp & full & ~x.lora, copies_layers, 0.0)


def _step_held(m: ModelSpec, x: MicroBatch) -> np.ndarray:
    """The loop's whole fp32 logits, alive through the optimizer step on the last stage
    (MicroBatch.step_logits_held: LitGPT's full.py)."""
    held = loop_held_step_logits_bytes(m, T=x.T, loss_tp_div=x.loss_tp_div)
    return np.where(x.last & x.step_logits_held, held, 0.0)


def _with_vision(
    m: ModelSpec, c: dict[str, np.ndarray], x: MicroBatch, out: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """`out` (_outside's) with a vision-language model's tower and cross-attention saved
    tensors (vision_saved_bytes) outside the language model's layers; a text model's as is."""
    if m.vision is None:
        return out
    vision = vision_saved_bytes(m, c, x)
    return {**out, "outside": out["outside"] + vision, "stage_act": out["stage_act"] + vision}


def vision_saved_bytes(m: ModelSpec, c: dict[str, np.ndarray], x: MicroBatch) -> np.ndarray:
    """What a vision-language model saves for backward beyond its language model's blocks:
    on the first stage, where the tower trains (_vision_memory.vision_trainable), its blocks'
    saved tensors (the block formulas of _layers on tower_spec, with the micro-batch's images as
    the batch and an image's patches as the sequence; unsplit by tp / cp, recomputed as the
    language model's blocks are) and the projector's (projector_saved_bytes); on every stage,
    Mllama's cross-attention blocks over the image keys (cross_attention_saved_bytes). A
    frozen tower saves nothing: no tensor before or in it requires grad.
    Source: transformers 5.24.0 Qwen2VisionTransformerPretrainedModel / MllamaVisionModel
    (their blocks are GradientCheckpointingLayer, checkpointed with the language model's).
    With autocast, the trained tower's cached 16-bit weight copies are its too
    (tower_autocast_copy_bytes).
    Ignores: the tower's patch embedding and positional embeddings' saved inputs (one [patches,
    d] tensor each), the rotary tables of the tower."""
    v = m.vision
    assert v is not None  # _with_vision's rows
    tower = tower_spec(v)
    images, per_image = tower_sequence(m, c)
    ones = np.ones_like(per_image)
    lora = x.lora & tower_adapted(v, c)  # PEFT's adapters in the tower or projector
    tower_mask = np.where(x.lora, tower_lora_targets(v, c), 0)
    ct = {
        **c,
        "seq_len": per_image,
        "micro_batch_size": np.maximum(images, 1.0),
        "tp": ones.astype(c["tp"].dtype),
        "cp": ones.astype(c["cp"].dtype),
        "pp": ones.astype(c["pp"].dtype),
        "sp": np.zeros_like(c["sp"]),
        "stage_pos": np.full_like(c["stage_pos"], STAGE_ONLY),
        "lora_rank": np.where(tower_mask != 0, c["lora_rank"], 0).astype(c["lora_rank"].dtype),
        "lora_targets": tower_mask,
        "qlora": np.zeros_like(c["qlora"]),
    }
    xt = micro_batch(tower, ct)
    saving_blocks = np.maximum(tower.num_hidden_layers - xt.num_checkpointed, 0.0)
    full_ft = projector_saved_bytes(m, c, e=x.e) + tower_autocast_copy_bytes(
        m, amp=x.amp, saving_blocks=saving_blocks
    )
    adapted = projector_lora_saved_bytes(
        v,
        c,
        images=images,
        per_image=per_image,
        e=x.e,
        amp=x.amp,
        in_param_dtype=x.adapters_in_param_dtype,
        through=tower_mask != 0,
    ) + tower_lora_copy_bytes(v, amp=x.amp, saving_blocks=saving_blocks, tower_on=tower_mask != 0)
    layers = np.where(x.lora & (tower_mask == 0), 0.0, _layers(tower, xt)["stage_layers"])
    blocks = layers + np.where(x.lora, adapted, full_ft)
    trains = (vision_trainable(m, c) | lora) & x.first & (images > 0)
    tower_bytes = np.where(trains, blocks, 0.0)
    saving = np.maximum(x.counts["layer"] - x.num_checkpointed, 0.0) / m.num_hidden_layers
    cross = cross_attention_saved_bytes(
        m, c, e=x.e, layers_saving=m.num_cross_attention_layers * saving
    )
    return tower_bytes + np.where(x.counts["layer"] > 0, cross, 0.0)


def activation_terms(m: ModelSpec, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Activation bytes of one micro-batch on one stage, and the loss/backward transients."""
    if m.profile is not None:
        return profile_activation_terms(m, c)
    x = micro_batch(m, c)
    T, e, pp, last, counts = x.T, x.e, x.pp, x.last, x.counts
    layers = _layers(m, x)
    out = _outside(m, x, layers)
    out = _with_vision(m, c, x, out)
    full, multi = x.rc == RECOMPUTE_FULL, pp > 1
    copies, copies_layers, loss_extra, loss_grads = _copies_and_loss(m, x, out, full=full)
    routed = routed_rows(m, T=T, capacity=x.capacity)
    a2a = all_to_all_buffer_bytes(m, rows=routed, e=e, ep=x.ep, num_moe=counts["moe"])
    cp_fwd, cp_bwd = ring_buffer_bytes(m, T=T, e=e, tp=x.tp, cp=x.cp)
    bwd = _backward_transients(m, x, layers, out["rope"], routed)
    small = (
        BUFFER_BYTES
        + INPUT_BYTES_PER_TOKEN * T
        + megatron_score_buffer_bytes(m, x)
        + out["run_held"]
    )
    # A pipeline schedule splits the whole batch up front: every micro-batch's input ids stay.
    inputs_per_extra_micro = np.where(multi, INPUT_BYTES_PER_TOKEN * T, 0.0)
    amp_ckpt_copies = _checkpointed_copies(x, copies_layers, full=full)
    per_micro, fixed = receive_buffer_bytes(
        np.where(multi, e * T * m.hidden_size / x.sp_div, 0.0), fw=x.fw
    )
    stage_act = out["stage_act"]
    kept, kept_layer, prev_graph = _bnb_kept_stage(m, x, layers)
    fwd_head = small + prev_graph + copies  # summed in the order the recording was made
    return {
        "activations_per_layer": layers["per_layer"],
        "activations_outside_layers": out["outside"],
        "activations_autocast_weight_copies": copies,
        "activations_offloaded": out["offloaded"],
        "stage_act": stage_act,
        "small": small,
        "fwd_extra": fwd_head
        + loss_extra
        + amp_ckpt_copies
        + a2a
        + cp_fwd
        + np.where(multi & ~last, bwd["fwd_working"], 0.0),
        # Inside a checkpointed block's forward (single stage): no loss tensors yet.
        "fwd_block_extra": np.where(
            full & ~multi, fwd_head + amp_ckpt_copies + a2a + cp_fwd + bwd["fwd_working"], -np.inf
        ),
        "bwd_start_extra": small
        + loss_grads
        + a2a
        + cp_bwd
        + np.where(last & x.chunked_head, _wrapper(m, x)[2], 0.0),
        "largest_block": _largest_block(m, x, out["head"]),
        "step_held": _step_held(m, x) + prev_graph,
        "bwd_end_extra": small + bwd["work_end"] - stage_act + kept - kept_layer,
        "embed_extra": small + kept + np.where(x.first, T * m.hidden_size * x.r, 0.0),
        **_recompute_terms(x, layers, out, bwd, small=small),
        "pipe_per_micro": per_micro + inputs_per_extra_micro,
        "pipe_fixed": fixed - inputs_per_extra_micro,
    }
