"""Activation bytes saved for backward, per layer and outside the layers.

Every function takes numpy columns (or scalars; they broadcast) and a ModelSpec, and returns bytes.
Symbols: T tokens per rank (b*s/cp), s sequence length, h hidden, f intermediate, a heads, t tensor
parallel degree, e compute-dtype bytes, r residual-stream bytes (fp32 under autocast).

The `hf` functions follow transformers' modeling code op by op (what autograd saves); they match
the traced ground truth (tests/data/groundtruth) to the allocator block. The `megatron` function is
Korthikanti et al. 2022.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ._codes import RECOMPUTE_FULL, RECOMPUTE_SELECTIVE
from ._model import ModelSpec

SMALL_TENSOR_BYTES = 512
"""One allocator block: what a scalar or an rng seed/offset tensor occupies."""
MASK_ALIGNMENT = 16
"""torch attention.cpp preprocess_mask: the efficient kernel's mask last dim is padded to 16."""


def hf_norm_bytes(
    m: ModelSpec,
    *,
    T,
    e,
    r,
    amp,
    sp_div,
    num_consumers: int,
    fused=False,
    fp32_input=False,
    input_saved=True,
    scale_fp32=False,
) -> np.ndarray:
    """Bytes one normalisation layer saves, including what its consuming linear(s) save.

    Source: transformers LlamaRMSNorm.forward (x.to(float32); x * rsqrt(mean(x^2)+eps);
    weight * x.to(input_dtype)), GemmaRMSNorm (x.float() ... * (1 + weight)), nn.LayerNorm
    (native_layer_norm saves input, mean and rstd). Under torch.autocast each consuming linear
    casts the fp32 norm output to bf16 itself (activations are not cached), so `num_consumers`
    copies are saved; without autocast the one output is shared.
    `fused`: the RMSNorm is torch's own (nn.RMSNorm / F.rms_norm, torchtitan), whose CUDA
    kernel `_fused_rms_norm` saves its input and the fp32 rstd only (torch
    aten/src/ATen/native/native_functions.yaml, tools/autograd/derivatives.yaml);
    `fp32_input`: on an fp32 copy of the input (torchtune's RMSNorm), which it keeps.
    `scale_fp32`: a Python RMSNorm whose scale multiplies the fp32 normalised tensor (litgpt
    0.5.13 model.py RMSNorm: `(x_normed * weight.float()).to(dtype)`), kept fp32 for the
    scale's gradient.
    `input_saved` false: a LayerNorm whose input another norm of the block already saves (a
    parallel block's two norms over the same hidden states: Falcon's new decoder architecture,
    ln_attn and ln_mlp; GPT-NeoX's use_parallel_residual, input_layernorm and
    post_attention_layernorm; modeling_falcon.py FalconDecoderLayer, modeling_gpt_neox.py
    GPTNeoXLayer). Traced: the conformance matrix's falcon-40b and pythia cells (one [T, h]
    residual-dtype tensor per layer was counted twice: +0.36% to +0.68% of the falcon-40b
    cells' activations).
    Assumes: with sequence parallelism the norm runs on T/t tokens and the consumers save the
    all-gathered full-sequence input.
    """
    h = m.hidden_size
    Th = T * h
    linear_in = np.where(amp, num_consumers * 2.0 * Th, e * Th)
    if m.norm == "layernorm":
        own = (np.where(input_saved, r * Th, 0.0) + 8.0 * T) / sp_div  # input, mean, rstd
    elif m.norm == "olmo2_rms":
        own = olmo2_rms_norm_bytes(T=T, width=h) / sp_div
    elif m.norm == "gemma_rms":
        own = (4.0 * Th + 4.0 * T + 4.0 * Th) / sp_div  # fp32 copy, rsqrt, normalised fp32
    else:
        # fp32 copy, rsqrt, normalised (input dtype; fp32 where the scale multiplies in fp32)
        python_rms = 4.0 * Th + 4.0 * T + np.where(scale_fp32, 4.0, r) * Th
        fused_input = np.where(fp32_input, 4.0, r) * Th
        own = np.where(fused, fused_input + 4.0 * T, python_rms) / sp_div  # fused: input, rstd
    return own + linear_in


def olmo2_rms_norm_bytes(*, T, width) -> np.ndarray:
    """Bytes one Olmo2RMSNorm over `width` features saves, whatever the dtypes.

    Source: transformers modeling_olmo2.py Olmo2RMSNorm.forward (x.to(float32); x *
    rsqrt(mean(x^2) + eps); (weight * x).to(input_dtype)): the fp32 input (a copy, or the input
    itself when it is fp32), the fp32 rsqrt [T, 1] and the normalised fp32 tensor (the weight
    multiplies in fp32). Its consumers (the residual add; the lm_head for the final norm) are
    counted by the caller.
    """
    return 8.0 * T * width + 4.0 * T


def hf_attention_bytes(
    m: ModelSpec, *, T, s, e, tp, eager, amp=False, transformers=False
) -> np.ndarray:
    """Bytes the attention block saves (projections' outputs, kernel saves), per layer.

    Source: transformers LlamaAttention / GPT2Attention with `sdpa_attention_forward` (SDPA flash
    saves q, k, v, out, an fp32 logsumexp [b, a, s] and philox seed/offset; GQA via enable_gqa,
    no repeat) or `eager_attention_forward` (repeat_kv copies, a view with one k/v head per rank;
    fp32 softmax output; its cast to
    the compute dtype saved by the second matmul; with attention dropout the bool mask and the
    dropout output instead; a contiguous copy of the output for o_proj).
    Assumes: rotary embeddings produce new q and k tensors; fused q/k/v projections (GPT-2 c_attn,
    Phi-3 qkv_proj) keep their whole output alive through the views SDPA saves (v, and q, k
    without rotary); for more than one sequence eager's torch.matmul copies v's view (at::matmul
    reshapes [b, a, s, d] to [b * a, s, d], a view only for b = 1), so the rotated q, k and that
    copy are what it saves (traced: GPT-NeoX and Phi-3, eager, bf16 and fp32, micro-batch 1 and
    2: the fused output was counted on top for b > 1, +14% of a layer). FlashAttention's
    logsumexp is unpadded.
    """
    a_r = m.num_attention_heads / tp
    qd_r = m.q_dim / tp
    kvd_r = m.kv_dim / tp
    gqa = m.num_key_value_heads < m.num_attention_heads
    # repeat_kv copies in eager; with one k/v head on the rank (multi-query, or kv heads = tp)
    # its expand + reshape is a view (the size-1 head dim merges into the stride-0 repeat dim)
    copied = eager & gqa & (m.num_key_value_heads / tp > 1)
    kv_saved = np.where(copied, qd_r, kvd_r)
    if m.fused_qkv:
        qkv = e * T * (qd_r + 2 * kvd_r)
        # SDPA keeps the fused output (v's view) and the rotated q, k; eager's matmuls do too
        # for one sequence, and for b > 1 save a copy of v instead (its view does not fold into
        # a batch of b * heads matrices)
        copies_v = eager & (np.asarray(T) > np.asarray(s))
        qkv = qkv + (np.where(copies_v, 0.0, e * T * (qd_r + kvd_r)) if m.rotary else 0.0)
    else:
        qkv = e * T * (qd_r + 2 * kv_saved)
    if m.fused_qkv and m.rotary:
        qkv = np.where(eager & gqa, qkv + 2 * e * T * (qd_r - kvd_r), qkv)
    out = e * T * qd_r
    flash_extra = 4.0 * a_r * T + 2 * SMALL_TENSOR_BYTES
    eager_extra = attention_score_bytes_per_elem(m, e, amp, transformers) * a_r * s * T
    eager_extra = eager_extra + softcap_scores_bytes(m, T=T, s=s, e=e, tp=tp)
    saved = qkv + out + np.where(eager, eager_extra, flash_extra)
    if m.model_type == "falcon":  # its own eager and SDPA paths
        falcon = falcon_eager_attention_bytes(m, T=T, s=s, e=e, tp=tp, amp=amp)
        return np.where(eager, falcon, falcon_sdpa_attention_bytes(m, T=T, s=s, e=e, tp=tp))
    return saved


def _falcon_kv_width(m: ModelSpec, *, T, s, tp) -> tuple[np.ndarray, np.ndarray]:
    """(the k / v width per rank as Falcon's attention reads them, the width its matmuls save
    them at): new_decoder_architecture broadcasts k and v to every query head (copies); a
    one-head k / v (multi-query) broadcast by a batched matmul is copied to every head when
    the micro-batch holds more than one sequence, and stays a view for one (the expanded
    [b, a, ...] folds into [b * a, ...] without a copy only when b = 1).

    Source: transformers modeling_falcon.py FalconAttention._split_heads and forward; torch
    at::matmul (expand, then reshape of the batch dims). Traced: the conformance matrix's
    Falcon-7B-shaped cells at micro-batch 1 and 2.
    """
    qd_r = m.q_dim / tp
    kv_r = qd_r if m.falcon_kv_expanded else m.kv_dim / tp
    one_head = (not m.falcon_kv_expanded) & (np.asarray(m.num_key_value_heads / tp) == 1)
    broadcast = one_head & (np.asarray(m.num_attention_heads / tp) > 1)
    saved = np.where(broadcast & (np.asarray(T) > np.asarray(s)), qd_r, kv_r)
    return np.asarray(kv_r), saved


def falcon_sdpa_attention_bytes(m: ModelSpec, *, T, s, e, tp) -> np.ndarray:
    """Falcon's SDPA attention, per layer, with the kernel its inputs get.

    Falcon always passes a materialised causal mask (allow_is_causal_skip=False), which rules
    out the flash kernel. With equal q and k / v heads (new_decoder_architecture broadcasts
    them) the memory-efficient kernel runs and saves q, k, v, the output (the input of
    `dense`, a view), a logsumexp [b, a, 32 ceil(s / 32)] fp32 and the mask converted to q's
    dtype ([b, 1, s, s]); with one k / v head and no enable_gqa only the math fallback takes
    them: it upcasts q, k, v to fp32 (16-bit inputs) and saves the scaled q, the scaled k and v
    (copied per head by the matmuls' broadcast for b > 1: _falcon_kv_width), the fp32 softmax
    output, and `dense` saves the merged output's copy.
    Source: transformers modeling_falcon.py (FalconModel.forward create_causal_mask with
    allow_is_causal_skip=False; FalconAttention.forward); torch 2.13 attention.cpp
    (convert_boolean_attn_mask, _scaled_dot_product_attention_math: query_acc / key_acc /
    value_acc upcast, `attn.add_(mask)`, _safe_softmax) and sdp_utils.cpp (flash: no mask;
    efficient: equal heads without enable_gqa); trace/_sdpa.py picks the kernel the same way.
    Traced: the conformance matrix's falcon and falcon-40b cells (bf16, amp-bf16, fp32).
    Assumes: an unpadded batch; no alibi (Falcon-7B/40B use rotary).
    """
    a_r = m.num_attention_heads / tp
    qd_r = m.q_dim / tp
    kv_r, kv_saved = _falcon_kv_width(m, T=T, s=s, tp=tp)
    s_arr = np.asarray(s, dtype=np.float64)
    lse = 4.0 * a_r * T * (32.0 * np.ceil(s_arr / 32.0)) / s_arr
    mask = efficient_mask_bytes(m, T=T, s=s, e=e, tp=tp)
    efficient = e * T * (qd_r + 2.0 * kv_r) + e * T * qd_r + lse + mask
    math = 4.0 * T * (qd_r + 2.0 * kv_saved) + 4.0 * a_r * s_arr * T + e * T * qd_r
    return np.where(kv_r == qd_r, efficient, math) + 2 * SMALL_TENSOR_BYTES


def falcon_eager_attention_bytes(m: ModelSpec, *, T, s, e, tp, amp) -> np.ndarray:
    """Falcon's eager attention, per layer: the rotated q and k, v, the attention
    probabilities and the merged output copy for `dense`.

    Source: transformers modeling_falcon.py FalconAttention.forward (no alibi): _split_heads
    slices the fused output (k and v indexed with [-2] / [-1]: copies; new_decoder_architecture
    broadcasts them to every query head and flattens: copies at the query width), transpose +
    reshape to [b, heads, s, d], apply_rotary_pos_emb (new q, k), `query @ key^T` (a one-head k
    broadcasts, no repeat), an in-place scale, `softmax(scores + mask, dtype=hidden dtype)` (its
    output saved in the hidden states' dtype: fp32 under autocast, whose matmul with v then
    saves a 16-bit cast too), `probs @ value`, `_merge_heads`-style reshape copied for dense.
    The fused projection output is not kept (only slices of it are read). Traced: a 2-layer
    Falcon-7B-shaped config, bf16, 128 tokens (trace 952,320 B per layer, this 951,296 B).
    """
    a_r = m.num_attention_heads / tp
    qd_r = m.q_dim / tp
    _, kv_saved = _falcon_kv_width(m, T=T, s=s, tp=tp)
    probs = attention_score_bytes_per_elem(m, e, amp) * a_r * s * T
    return e * T * (qd_r + 2.0 * kv_saved) + probs + e * T * qd_r


def softcap_scores_bytes(m: ModelSpec, *, T, s, e, tp) -> np.ndarray:
    """What eager attention with logit soft-capping saves beyond plain eager, per layer: the
    tanh output [b, a/t, s, s] in the compute dtype (tanh's backward reads its output; the
    division and multiplication by the cap are by a Python scalar and save nothing).

    Source: transformers modeling_gemma2.py eager_attention_forward (scores / softcap, tanh,
    * softcap before the mask and the fp32 softmax). Traced: `trainmem trace` of a 2-layer
    Gemma-2 config (eager; bf16 and fp32; s 32 and 128).
    Ignores: FlashAttention-2's softcap (in-kernel, saves nothing more).
    """
    if m.attn_logit_softcapping <= 0:
        return np.zeros_like(np.asarray(T, dtype=np.float64))
    return e * (m.num_attention_heads / tp) * s * T


def sandwich_post_norm_bytes(m: ModelSpec, *, T, sp_div) -> np.ndarray:
    """Bytes the two post-norms of a Gemma-2 block save (post_attention_layernorm after
    o_proj, post_feedforward_layernorm after down_proj), per layer: each keeps its fp32 input
    (a copy of the 16-bit projection output, or that output itself in fp32), the fp32 rsqrt
    [T, 1] and the normalised fp32 tensor that (1 + weight) multiplies; its output feeds the
    residual add, which saves nothing.

    Source: transformers modeling_gemma2.py Gemma2RMSNorm.forward (self._norm(x.float()) *
    (1.0 + self.weight.float())).type_as(x)) and Gemma2DecoderLayer.forward (sandwich norms).
    """
    if m.num_norms_per_layer != 4:
        return np.zeros_like(np.asarray(T, dtype=np.float64))
    return 2.0 * olmo2_rms_norm_bytes(T=T, width=m.hidden_size) / sp_div


def final_softcap_bytes(m: ModelSpec, *, T, e, loss_tp_div) -> np.ndarray:
    """What final logit soft-capping saves: the tanh output [T, v] in the logits' dtype.

    Source: transformers modeling_gemma2.py Gemma2ForCausalLM.forward (logits / cap, tanh,
    * cap before the loss). Traced as softcap_scores_bytes: the outside-layer bytes differ from
    the formula without it by exactly T x v x the compute dtype's bytes.
    """
    if m.final_logit_softcapping <= 0:
        return np.zeros_like(np.asarray(T, dtype=np.float64))
    return e * T * m.vocab_size / loss_tp_div


def sliding_window_masked(m: ModelSpec, *, s) -> np.ndarray:
    """Whether transformers builds an explicit sliding-window mask for sequence length s.

    Source: transformers masking_utils.py create_sliding_window_causal_mask (local_size =
    config.sliding_window) and _ignore_causal_mask_sdpa: the mask is skipped (SDPA's is_causal)
    only while kv_length < local_attention_size.
    """
    return (m.sliding_window > 0) & (np.asarray(s) >= max(m.sliding_window, 1))


def alternating_window_sdpa_delta_bytes(
    m: ModelSpec, *, T, s, e, tp, eager, enable_gqa=True, image_masked=False
) -> np.ndarray:
    """What Gemma 3's sliding-window layers save under SDPA beyond the unmasked kernels that
    hf_sdpa_kernel_delta_bytes assumes for them, per layer (averaged over the blocks): from the
    window's length on, a sliding layer gets a bool mask, so its k and v are repeated to every
    head and the memory-efficient kernel saves the additive mask (hf_sdpa_kernel_delta_bytes
    with the window set); the global layers run unmasked.

    Source: transformers modeling_gemma3.py Gemma3TextModel.forward (create_causal_mask for
    full_attention layers, create_sliding_window_causal_mask for sliding_attention ones; SDPA
    skips either mask while the kv length is below its window); traced: bench/conformance.py
    family gemma3 (two sliding layers and one global, window 128, s 64 / 128 / 256).
    Assumes: the stage holds sliding layers in the model's proportion (num_sliding_layers / L).
    `image_masked` rows: none (every layer's mask is hf_sdpa_kernel_delta_bytes' already).
    """
    if not m.num_sliding_layers:
        return np.zeros_like(np.asarray(T, dtype=np.float64))
    windowed = replace(m, sliding_window=m.alternating_sliding_window)
    kernel = {"T": T, "s": s, "e": e, "tp": tp, "eager": eager, "enable_gqa": enable_gqa}
    masked = hf_sdpa_kernel_delta_bytes(windowed, **kernel) - hf_sdpa_kernel_delta_bytes(
        m, **kernel
    )
    return np.where(image_masked, 0.0, masked * m.num_sliding_layers / m.num_hidden_layers)


def alternating_window_checkpointed_mask_bytes(
    m: ModelSpec, *, T, s, r, eager, image_masked=False
) -> np.ndarray:
    """The masks Gemma 3's checkpointed blocks keep for their backward: SDPA, the sliding
    layers' bool [1, 1, s, s] mask from the window's length on (the global layers' causal mask
    is skipped); eager, both additive [b, 1, s, s] masks in the embeddings' dtype (sliding and
    causal, built at every length).

    Source: torch.utils.checkpoint (non-reentrant: each block's attention_mask argument stays
    alive until its recomputation) and transformers modeling_gemma3.py (one mask per layer type,
    masking_utils.py sdpa_mask / eager_mask); traced: bench/conformance.py family gemma3. With
    images (`image_masked` rows), SDPA's two masks are per-sample bool [b, 1, s, s] tensors
    (create_masks_for_vision_model).
    """
    if not m.num_sliding_layers:
        return np.zeros_like(np.asarray(T, dtype=np.float64))
    windowed = np.asarray(s) >= m.alternating_sliding_window
    sdpa = np.where(windowed, np.asarray(s, dtype=np.float64) ** 2, 0.0)
    # with images (image_masked): both layer types' bool masks, per sample [b, 1, s, s]
    sdpa = np.where(image_masked, 2.0 * np.asarray(T, dtype=np.float64) * s, sdpa)
    return np.where(eager, 2.0 * r * T * s, sdpa)


def rope_table_bytes(m: ModelSpec, *, s, r) -> np.ndarray:
    """The rotary cos/sin tables [1, s, rotated width] in the residual dtype, for every table
    pair the model builds (Gemma 3: a local and a global one; MLA kept at head_dim).

    Source: transformers LlamaRotaryEmbedding.forward (cos, sin cast to x.dtype), saved by
    apply_rotary_pos_emb's multiplications; modeling_gemma3.py (one rotary_emb call per layer
    type present).
    """
    width = m.head_dim if m.is_mla else m.rotary_dim
    return 2.0 * s * width * r * m.num_rotary_tables if m.rotary else 0.0 * np.asarray(s)


ROPE_BUFFER_BYTES = 4.0
"""LitGPT's cos/sin buffers are fp32: build_rope_cache computes them from `.float()` positions
and fit rebuilds them after Fabric's cast (model.max_seq_length = ...). Source: litgpt 0.5.13
model.py build_rope_cache, GPT.max_seq_length; finetune/lora.py fit."""


def rope_buffer_bytes(m: ModelSpec, *, s) -> np.ndarray:
    """Persistent RoPE cos/sin buffers [max_seq_length, rope_n_elem] (ROPE_BUFFER_BYTES each),
    alive in every phase; max_seq_length is the training length s (fit sets it).

    Source: litgpt 0.5.13 model.py GPT.max_seq_length (register_buffer cos, sin; rebuilt when
    the length changes). Traced: litgpt_lora.json rope_cache_buffers_bytes.
    """
    return 2.0 * np.asarray(s, dtype=np.float64) * m.rotary_dim * ROPE_BUFFER_BYTES * m.rotary


ROPE_BLOCK_CACHE_BYTES = 8.0
"""complex64: bytes per element of a block's RoPE cache."""


def rope_block_cache_bytes(m: ModelSpec, *, s) -> np.ndarray:
    """One block's RoPE cache: complex64 [max_seq_len, rotary dim / 2], max_seq_len the training
    length (the Trainer resizes it). Source: torchtitan 0.3.0 models/common/rope.py ComplexRoPE
    (register_buffer("cache"), one per attention module), models/common/decoder.py
    update_from_config;
    traced: torchtitan_llama3_8b_fsdp.json rope_cache_buffers_bytes."""
    return ROPE_BLOCK_CACHE_BYTES * np.asarray(s, dtype=np.float64) * m.rotary_dim / 2.0 * m.rotary


def hf_sdpa_kernel_delta_bytes(
    m: ModelSpec, *, T, s, e, tp, eager, enable_gqa=True, image_masked=False
) -> np.ndarray:
    """Change of a layer's saved bytes when SDPA's inputs do not run the flash kernel that
    hf_attention_bytes assumes, or run it with q in another layout, per layer.

    Source: transformers sdpa_attention.py (use_gqa_in_sdpa: with a mask, k and v go through
    repeat_kv) and modeling_phi3.py apply_rotary_pos_emb (torch.cat([q_rot..., q_pass]) returns q
    contiguous in [b, a, s, d]); torch 2.13 attention.cpp (convert_boolean_attn_mask: a new
    additive mask in q's dtype per call; a mask rules out flash, so the memory-efficient kernel
    runs and saves that mask; flash's output takes q's layout, and `.transpose(1, 2)
    .contiguous()` for o_proj then copies it). Traced with `trainmem trace` on Phi-3 and Mistral
    configs (sweep/_trace_sdpa.py picks the kernel as a Hopper GPU does).
    Assumes: SDPA (not eager); an unpadded batch (the bool mask is [1, 1, s, s], its float copy
    [b, 1, s, s]); s a multiple of 32 (the efficient kernel pads its logsumexp to 32; 0.2%
    of the mask when s = 200).
    `enable_gqa` (rows): the model passes k and v with their own heads (transformers'
    use_gqa_in_sdpa on CUDA without a mask); false where the framework's attention does not.
    Ignores: transformers' other masks (padding, packed sequences, Gemma-2/3 and Qwen2
    use_sliding_window layers). Falcon has its own SDPA path (falcon_sdpa_attention_bytes).
    `image_masked` (rows): every layer gets a mask for the images (Gemma 3 with images,
    _vision_memory.image_block_masked), as a layer past its window does.
    """
    if m.model_type == "falcon":
        return np.zeros_like(np.asarray(T, dtype=np.float64))
    qd_r = m.q_dim / tp
    kvd_r = m.kv_dim / tp
    masked = sliding_window_masked(m, s=s) | np.asarray(image_masked, dtype=bool)
    gqa = m.num_key_value_heads < m.num_attention_heads
    if not gqa:
        repeat = 0.0
    elif m.fused_qkv and m.rotary:
        # q, repeated k and v (3 e T qd) replace qkv (kept by v's view) and the rotated q, k.
        repeat = e * T * (qd_r - 3 * kvd_r)
    else:
        repeat = 2.0 * e * T * (qd_r - kvd_r)  # repeated k, v replace k, v
    additive_mask = efficient_mask_bytes(m, T=T, s=s, e=e, tp=tp)
    flash = ~masked & (np.asarray(e) < 4)  # flash takes 16-bit inputs only
    out_copy = np.where(flash & m.rotary_cat, e * T * qd_r, 0.0)
    # fp32 without a mask and with fewer k/v heads: neither flash nor efficient (equal heads
    # only) takes it, so SDPA's math fallback runs (sdpa_math_fallback_bytes).
    math = ~masked & (np.asarray(e) >= 4) & gqa & enable_gqa
    math_extra = sdpa_math_fallback_bytes(m, T=T, s=s, e=e, tp=tp) + repeat
    unmasked = np.where(math, math_extra, out_copy)
    return np.where(eager, 0.0, np.where(masked, additive_mask + repeat, unmasked))


def efficient_mask_bytes(m: ModelSpec, *, T, s, e, tp) -> np.ndarray:
    """The additive mask SDPA's memory-efficient kernel saves, per layer: [b, 1, s, s] in q's
    dtype (b s^2 = T s); preprocess_mask pads a last dim that is not a multiple of 16,
    materialising the mask per head: [b, a, s, 16 ceil(s / 16)].

    Source: torch 2.13 attention.cpp (convert_boolean_attn_mask, preprocess_mask); traced with
    `trainmem trace` (Phi-3, Mistral, Falcon-40B).
    """
    s_arr = np.asarray(s, dtype=np.float64)
    s_pad = MASK_ALIGNMENT * np.ceil(s_arr / MASK_ALIGNMENT)
    return np.where(s_pad == s_arr, e * T * s_arr, e * T * s_pad * m.num_attention_heads / tp)


def sdpa_math_fallback_bytes(m: ModelSpec, *, T, s, e, tp) -> np.ndarray:
    """What SDPA's math fallback saves beyond the flash kernel's saves, per layer (the k/v
    repeat is added by the caller).

    Source: torch 2.13 attention.cpp _scaled_dot_product_attention_math (enable_gqa:
    repeat_interleave of k and v; scores materialised: the fp32 softmax output, with attention
    dropout the fused dropout's bool mask and its output, saved by the matmul with v), run when
    sdp_utils.cpp rules out flash (fp32) and the memory-efficient kernel (unequal q / kv heads);
    trace/_sdpa.py picks it the same way. Traced on the conformance matrix's Llama, OLMo 2 and
    Granite fp32 cells.
    Assumes: as eager's scores (hf_attention_bytes), without flash's logsumexp and rng state.
    """
    a_r = m.num_attention_heads / tp
    flash_extra = 4.0 * a_r * T + 2 * SMALL_TENSOR_BYTES
    return attention_score_bytes_per_elem(m, e) * a_r * s * T - flash_extra


def attention_score_bytes_per_elem(m: ModelSpec, e, amp=False, transformers=False) -> np.ndarray:
    """Bytes saved per attention score element when the scores are materialised (eager or
    SDPA's math fallback): the softmax output and its cast to the compute dtype, saved by the
    matmul with v; with attention dropout the bool mask and the dropout output instead.

    Falcon's softmax runs in the hidden states' dtype (fp32 under autocast, then its 16-bit cast
    for the matmul with v). The softmax is fp32 where the model asks for it (Llama-style
    eager_attention_forward:
    softmax(dtype=float32).to(query.dtype)) or autocast runs it (softmax is an fp32 autocast
    op); transformers' GPT-2 and BERT eager attention (`transformers`: rows run by
    transformers' modeling code) call softmax in the scores' own dtype, so without autocast it
    saves 16 bits there.
    Source: transformers modeling_llama.py / modeling_gpt2.py / modeling_bert.py
    eager_attention_forward; torch autocast's fp32 op list (softmax). Traced: the conformance
    matrix's gpt2 bf16 eager cells (were +0.9% to +1.7%, 2 bytes per score high; now exact).
    """
    if m.model_type == "falcon":  # softmax(dtype=hidden dtype), no dropout: falcon_eager_...
        return np.where(np.asarray(amp, dtype=bool), 4.0 + e, e)
    own_dtype = (m.family in ("gpt2", "bert")) & np.asarray(transformers, dtype=bool)
    softmax = np.where(own_dtype & ~np.asarray(amp, dtype=bool), e, 4.0)
    return np.where(
        m.attention_dropout > 0,
        softmax + 1.0 + e,  # softmax + dropout mask + dropout output
        softmax + np.where(softmax > e, e, 0.0),  # softmax (+ its cast, saved by matmul)
    )


def hf_checkpointed_mask_bytes(m: ModelSpec, *, T, s, r, eager, image_masked=False) -> np.ndarray:
    """Bytes of the sliding-window mask that full recomputation keeps for its backward.

    Source: torch.utils.checkpoint (non-reentrant) keeps each block's arguments, the
    attention_mask among them, until the block's recomputation; transformers masking_utils.py
    sdpa_mask builds a bool [1, 1, s, s] mask, eager_mask an additive [b, 1, s, s] one in the
    embeddings' dtype.
    Assumes: an unpadded batch.
    Ignores: eager's plain causal mask, kept the same way without a window (every family).
    """
    size = np.where(eager, r * T * s, np.asarray(s, dtype=np.float64) ** 2)
    windowed = np.where(sliding_window_masked(m, s=s), size, 0.0)
    return windowed + alternating_window_checkpointed_mask_bytes(
        m, T=T, s=s, r=r, eager=eager, image_masked=image_masked
    )


def hf_mlp_bytes(m: ModelSpec, *, T, e, amp, tp) -> np.ndarray:
    """Bytes the MLP saves, per layer.

    Source: LlamaMLP (down(act(gate(x)) * up(x)): gate out, act out, up out, product);
    GPT2MLP with NewGELUActivation (transformers activations.py: the Python tanh formula saves
    x (an fp32 copy under autocast, pow being an fp32 autocast op), 0.5*x, tanh, 1+tanh, and the
    output's cast for c_proj); BERT/Gemma torch gelu (fc out, act out); CLIP's
    QuickGELUActivation (fc1 out, sigmoid(1.702 x), their product for fc2).
    """
    f_r = m.intermediate_size / tp
    Tf = T * f_r
    if m.gated_mlp:
        return 4.0 * e * Tf
    if m.mlp_act == "gelu_new":
        per_elem = np.where(amp, 4.0 + 2.0 + 4.0 + 4.0 + 2.0, 5.0 * e)
        return per_elem * Tf
    if m.mlp_act == "quick_gelu":  # x * sigmoid(1.702 x): x, the sigmoid, the product
        return 3.0 * e * Tf
    return 2.0 * e * Tf


def hf_layer_bytes(
    m: ModelSpec,
    *,
    T,
    s,
    e,
    r,
    amp,
    tp,
    sp,
    eager,
    fused_norm=False,
    norm_fp32_input=False,
    enable_gqa=True,
    transformers=False,
    norm_scale_fp32=False,
    image_masked=False,
) -> np.ndarray:
    """Everything one transformer block saves for backward without recomputation
    (`fused_norm`, `norm_scale_fp32` (its `scale_fp32`): see hf_norm_bytes; `enable_gqa`,
    `image_masked`: see hf_sdpa_kernel_delta_bytes; `transformers`: see
    attention_score_bytes_per_elem)."""
    sp_div = np.where(sp, tp, 1)
    num_qkv_linears = 1 if m.fused_qkv else 3
    num_up_linears = 1 if (m.fused_gate_up or not m.gated_mlp) else 2
    norm = {"T": T, "e": e, "r": r, "amp": amp, "sp_div": sp_div, "fused": fused_norm}
    norm["fp32_input"] = norm_fp32_input
    norm["scale_fp32"] = norm_scale_fp32
    if m.num_norms_per_layer == 1:
        norms = block_single_norm_bytes(m, norm, num_qkv_linears + num_up_linears)
    else:
        norms = hf_norm_bytes(m, **norm, num_consumers=num_qkv_linears)
        second = {"num_consumers": num_up_linears, "input_saved": not m.parallel_residual}
        norms = norms + hf_norm_bytes(m, **norm, **second)
    dropout_masks = 2.0 * T * m.hidden_size / sp_div if m.dropout > 0 else 0.0
    norms = norms + sandwich_post_norm_bytes(m, T=T, sp_div=sp_div)
    return (
        norms
        + hf_attention_bytes(
            m, T=T, s=s, e=e, tp=tp, eager=eager, amp=amp, transformers=transformers
        )
        + hf_sdpa_kernel_delta_bytes(
            m, T=T, s=s, e=e, tp=tp, eager=eager, enable_gqa=enable_gqa, image_masked=image_masked
        )
        + alternating_window_sdpa_delta_bytes(
            m, T=T, s=s, e=e, tp=tp, eager=eager, enable_gqa=enable_gqa, image_masked=image_masked
        )
        + hf_mlp_bytes(m, T=T, e=e, amp=amp, tp=tp)
        + dropout_masks
    )


def block_single_norm_bytes(m: ModelSpec, norm: dict, num_consumers: int) -> np.ndarray:
    """A parallel block's one norm, read by attention's and the MLP's input linears.

    Source: transformers modeling_phi.py PhiDecoderLayer (input_layernorm feeds self_attn and
    mlp), modeling_falcon.py FalconDecoderLayer (parallel_attn with one input_layernorm:
    mlp_layernorm_out = attention_layernorm_out), modeling_stablelm.py with
    use_parallel_residual: the norm saves its own tensors once; under autocast each consuming
    linear saves its own 16-bit cast (hf_norm_bytes), without autocast they share the output.
    """
    return hf_norm_bytes(m, **norm, num_consumers=num_consumers)


def hf_checkpointed_layer_bytes(m: ModelSpec, *, T, r, tp, sp) -> np.ndarray:
    """Per-layer bytes kept with full recomputation: the checkpointed layer input only.

    Source: torch.utils.checkpoint (non-reentrant) as enabled by
    `model.gradient_checkpointing_enable()`: the block's input hidden states are saved; the rotary
    cos/sin are shared model-level tensors.
    """
    return r * T * m.hidden_size / np.where(sp, tp, 1)


def hf_outside_bytes(
    m: ModelSpec,
    *,
    T,
    s,
    e,
    r,
    amp,
    tp,
    sp,
    loss_tp_div,
    fused_norm=False,
    norm_fp32_input=False,
    head_trainable=True,
    norm_scale_fp32=False,
) -> np.ndarray:
    """Bytes saved outside the blocks: embeddings, final norm, head, loss, rope tables, labels.

    Source: LlamaForCausalLM.forward + ForCausalLMLoss (logits.float(); cross_entropy =
    log_softmax, whose fp32 output is saved, + nll_loss); rotary cos/sin [1, s, head_dim] in the
    hidden dtype; shifted labels int64; GPT-2/BERT embedding dropout mask and position ids.
    Assumes: unpadded, unpacked batches; the logits are gathered on every TP rank (HF tp_plan,
    torchtitan loss_parallel off) unless `loss_tp_div` says otherwise.
    """
    h, v = m.hidden_size, m.vocab_size
    sp_div = np.where(sp, tp, 1)
    out = 4.0 * T * v / loss_tp_div  # log_softmax output, fp32
    out = out + final_softcap_bytes(m, T=T, e=e, loss_tp_div=loss_tp_div)
    out = out + 8.0 * T + 3 * SMALL_TENSOR_BYTES  # shifted labels, loss, weights
    if m.family == "bert":
        # MLM head transform: dense -> gelu -> LayerNorm -> decoder.
        out = out + 3.0 * e * T * h + 8.0 * T
    else:
        out = out + hf_norm_bytes(
            m,
            T=T,
            e=e,
            r=r,
            amp=amp,
            sp_div=sp_div,
            num_consumers=1,
            fused=fused_norm,
            fp32_input=norm_fp32_input,
            scale_fp32=norm_scale_fp32,
        )
        # A frozen head (LoRA) keeps no input: its gradient needs only the weight.
        head_input = np.where(amp, 2.0, e) * T * h
        out = out - np.where(head_trainable, 0.0, head_input)
    out = out + rope_table_bytes(m, s=s, r=r)
    if m.family in ("gpt2", "bert"):
        out = out + 8.0 * s  # position ids (int64)
        if m.dropout > 0:
            out = out + 1.0 * T * h  # embedding dropout mask
    return out


def hf_loss_forward_extra_bytes(m: ModelSpec, *, T, e, r, amp, loss_tp_div) -> np.ndarray:
    """Transient bytes at the forward peak (the loss): logits, their fp32 copy, head input.

    Source: ForCausalLMLoss: `logits = logits.float()` (a copy unless already fp32), while the
    16-bit logits are still referenced; under autocast the fp32 final-norm output is held by the
    model's forward frame.
    """
    Tv = T * m.vocab_size / loss_tp_div
    logits = e * Tv + np.where(e < 4, 4.0 * Tv, 0.0)
    return logits + np.where(amp, 4.0 * T * m.hidden_size, 0.0)


MEGATRON_SOFTMAX_BYTES = 4.0
"""megatron-core's unfused core attention keeps its softmax output in fp32
(TransformerConfig.attention_softmax_in_fp32 defaults to True; FusedScaleMaskSoftmax's torch
path upcasts the scores); the fused kernels keep 16 bits (megatron_softmax_bytes). Source:
megatron-core 0.16.1 megatron/core/transformer/dot_product_attention.py, fusions/fused_softmax.py
forward_torch_softmax; traced: tests/data/framework_traces/megatron_gpt_local.json."""
FUSED_SOFTMAX_MIN_KEYS = 16.0
FUSED_SOFTMAX_MAX_KEYS = 4096.0
"""FusedScaleMaskSoftmax.is_kernel_available: 16 < sk <= 4096 (exclusive, inclusive).
Source: megatron-core 0.16.1 megatron/core/fusions/fused_softmax.py."""
FUSED_SOFTMAX_ALIGN = 4.0
"""is_kernel_available: sq, sk and attn_batches (b x heads per rank) divisible by 4."""
FUSED_SOFTMAX_THREADS_PER_BLOCK = 128.0
FUSED_SOFTMAX_WARP_SIZE = 32.0
"""apex csrc/megatron/scaled_masked_softmax.h get_batch_per_block: 128 threads per block,
warps of min(next_pow2(sk), C10_WARP_SIZE = 32) threads, 2 rows per warp when next_pow2(sk) <=
128 (else 1); the causal kernel needs attn_batches divisible by the rows per block."""
FUSED_SOFTMAX_TWO_ROWS_MAX_KEYS = 128.0
"""get_batch_per_block: batches_per_warp = 2 when next_pow2(sk) <= 128, else 1."""


def megatron_fused_softmax_runs(*, s, b, heads_per_rank, sixteen_bit) -> np.ndarray:
    """Whether megatron's FusedScaleMaskSoftmax takes its fused causal kernel
    (ScaledUpperTriangMaskedSoftmax) for [b, heads_per_rank, s, s] scores, given that
    masked_softmax_fusion is on.

    Source: megatron-core 0.16.1 megatron/core/fusions/fused_softmax.py
    FusedScaleMaskSoftmax.is_kernel_available (16-bit input, 16 < sk <= 4096, sq, sk and
    b x np divisible by 4, causal: b x np divisible by get_batch_per_block); apex
    csrc/megatron/scaled_masked_softmax.h get_batch_per_block (the kernels come from apex,
    built into NVIDIA's PyTorch containers, not from the megatron-core wheel).
    Assumes: self-attention with a causal mask (sq = sk = s), no softmax offset (vanilla).
    """
    s = np.asarray(s, dtype=np.float64)
    attn_batches = np.asarray(b, dtype=np.float64) * heads_per_rank
    next_pow2 = 2.0 ** np.ceil(np.log2(np.maximum(s, 1.0)))
    warp = np.minimum(next_pow2, FUSED_SOFTMAX_WARP_SIZE)
    rows_per_warp = np.where(next_pow2 <= FUSED_SOFTMAX_TWO_ROWS_MAX_KEYS, 2.0, 1.0)
    rows_per_block = FUSED_SOFTMAX_THREADS_PER_BLOCK / warp * rows_per_warp

    def divides(d, n):  # floor division (the formula tracer has no scalar remainder)
        return np.floor(n / d) * d == n

    return (
        np.asarray(sixteen_bit, dtype=bool)
        & (s > FUSED_SOFTMAX_MIN_KEYS)
        & (s <= FUSED_SOFTMAX_MAX_KEYS)
        & divides(FUSED_SOFTMAX_ALIGN, s)
        & divides(FUSED_SOFTMAX_ALIGN, attn_batches)
        & divides(rows_per_block, attn_batches)
    )


def megatron_softmax_bytes(*, fused, e) -> np.ndarray:
    """Bytes per attention score of the probabilities megatron's core attention saves: the
    fused kernel's output in the scores' 16-bit dtype, else the torch path's fp32 softmax
    (MEGATRON_SOFTMAX_BYTES). Source: megatron-core 0.16.1 fusions/fused_softmax.py
    (ScaledUpperTriangMaskedSoftmax saves softmax_results, 16-bit; forward_torch_softmax
    upcasts under attention_softmax_in_fp32)."""
    return np.where(fused, e, MEGATRON_SOFTMAX_BYTES)


def megatron_layer_bytes(
    m: ModelSpec, *, s, b, tp, sp, recompute_code, eager, softmax_bytes=MEGATRON_SOFTMAX_BYTES
) -> np.ndarray:
    """Korthikanti et al. 2022 (arXiv 2205.05198) activation bytes per layer, 16-bit.

    Source: Sec. 4, Eq. 1-2 and Table 2: sbh(34 + 5as/h) with no parallelism; tensor parallel
    sbh(10 + 24/t + 5as/(ht)); + sequence parallel sbh(34/t + 5as/(ht)); selective recompute drops
    the 5as/h attention-core term; full recompute keeps 2sbh (the layer input).
    Terms: attention 11sbh + 5as^2b, MLP 19sbh, two LayerNorms 4sbh (dropout masks included).
    The core's 5as^2b is a 16-bit softmax output and, with attention dropout, its mask (1) and
    output (2): the fused softmax kernel (`softmax_bytes` 2, megatron_softmax_bytes); its torch
    path keeps the softmax in fp32 (4), its 16-bit cast where there is no dropout, and a [s, s]
    bool causal mask per layer. With flash attention (Megatron-core's TE /
    flash core attention, `eager` false) the core keeps no s x s tensor: only its fp32 softmax
    statistics, 4asb bytes (Dao 2022 Sec. 3.1); the core's output and Q, K, V are already in the
    11sbh.
    Assumes: GPT architecture (MLP 4h, MHA, dropout); generalised to gated MLPs and GQA by the
    ratios f/4h and kv/h on the matrix terms.
    """
    h, a = m.hidden_size, m.num_attention_heads
    sbh = s * b * h
    f_ratio = m.intermediate_size / (4 * h) * (2.0 if m.gated_mlp else 1.0)
    kv_ratio = m.kv_dim / m.hidden_size
    # Korthikanti Eq. 1 split: replicated (not divided by t without SP) 10sbh; divided 24sbh.
    divided = (24.0 - 16.0 + 16.0 * f_ratio) - (2.0 * (1.0 - kv_ratio) * 2.0)
    replicated = 10.0
    # Without attention dropout the bmm keeps the softmax's 16-bit cast instead of a mask and
    # the dropout output.
    softmax_bytes = np.asarray(softmax_bytes, dtype=np.float64)
    upcast = softmax_bytes > 2
    after_softmax = 3.0 if m.attention_dropout > 0 else np.where(upcast, 2.0, 0.0)
    scores = (softmax_bytes + after_softmax) * a * s / h
    core = np.where(eager, scores, 4.0 * a / h)
    per = np.where(sp, (replicated + divided) / tp, replicated + divided / tp)
    keeps_core = recompute_code != RECOMPUTE_SELECTIVE
    per = per + np.where(keeps_core, core / tp, 0.0)
    causal_mask = np.where(eager & keeps_core & upcast, s * s, 0.0)  # [s, s] bool
    full = 2.0 * sbh / np.where(sp, tp, 1)
    return np.where(recompute_code == RECOMPUTE_FULL, full, sbh * per + causal_mask)


def hf_qk_norm_bytes(m: ModelSpec, *, T, r, tp) -> np.ndarray:
    """Extra bytes of per-head q/k RMSNorm (Qwen3 q_norm, k_norm), per layer.

    Source: transformers Qwen3Attention: q_norm(q_proj(x).view(..., head_dim)) is an RMSNorm
    (fp32 copy, rsqrt per head, normalised tensor saved by the weight multiply); its output feeds
    rotary, which saves nothing (cos/sin need no grad). OLMo 2 (modeling_olmo2.py): one
    Olmo2RMSNorm over the whole q_proj / k_proj output (olmo2_rms_norm_bytes; with tensor
    parallelism counted on the rank's share, as if the norm were split). Gemma 3
    (modeling_gemma3.py Gemma3RMSNorm over head_dim): the fp32 input (a copy, or the fp32 input
    itself) and the normalised fp32 tensor that (1 + weight) multiplies, in every precision.
    Ignores: the LayerNorm layouts (Phi, StableLM qk_layernorm), counted as Qwen3's.
    """
    if not m.qk_norm:
        return np.zeros_like(np.asarray(T, dtype=np.float64))
    width = (m.q_dim + m.kv_dim) / tp
    if m.qk_norm_layout == "full":
        return olmo2_rms_norm_bytes(T=T, width=width) + 4.0 * T  # q_norm and k_norm
    heads = (m.num_attention_heads + m.num_key_value_heads) / tp
    if m.norm == "gemma_rms":  # Gemma3RMSNorm: fp32 input and normalised fp32, whatever r
        return 8.0 * T * width + 4.0 * T * heads
    return (4.0 + r) * T * width + 4.0 * T * heads


def hf_mla_attention_bytes(m: ModelSpec, *, T, e, r, tp, eager, s) -> np.ndarray:
    """Multi-head latent attention (DeepSeek-V2/V3), per layer, after the input norm.

    Source: transformers DeepseekV3Attention: q_a_proj -> q_a_layernorm -> q_b_proj;
    kv_a_proj_with_mqa -> split -> kv_a_layernorm -> kv_b_proj (value_states is a view of its
    output, so the whole output is kept); rotary on the rope parts; cat into query and key (new
    tensors saved by attention); out [T, a v_head]; flash logsumexp.
    Assumes: eager scores as in hf_attention_bytes (fp32 softmax + its 16-bit cast).
    """
    a_r = m.num_attention_heads / tp
    ql, kvl = m.q_lora_rank, m.kv_lora_rank
    norm_saved = lambda width: (4.0 + r + e) * T * width + 4.0 * T  # noqa: E731
    q_path = (norm_saved(ql) if ql else 0.0) + e * T * m.q_dim / tp
    kv_path = norm_saved(kvl) + e * T * a_r * (m.qk_nope_head_dim + m.v_head_dim)
    key = e * T * m.kv_dim / tp
    out = e * T * a_r * m.v_head_dim
    flash_extra = 4.0 * a_r * T + 2 * SMALL_TENSOR_BYTES
    eager_extra = (4.0 + np.where(e < 4, e, 0.0)) * a_r * s * T
    return q_path + kv_path + key + out + np.where(eager, eager_extra, flash_extra)


def hf_moe_bytes(m: ModelSpec, *, T, e, e_expert, amp, etp=1.0, capacity=0.0) -> np.ndarray:
    """Bytes an MoE block saves (router, routed experts, shared experts), per layer.

    Source: transformers 5 `grouped_mm_experts_forward` (integrations/moe.py), the default
    experts implementation, checked op by op on a CPU trace of a Mixtral-style model: the routed
    input gathered by expert (S = T x top_k rows), the gate/up output [S, 2f], the activation and
    product [S, f], the down output [S, h] (saved by the routing-weight multiply), the router's
    fp32 softmax, top-k indices, sort permutation and inverse, the gathered routing weights.
    Experts run in the parameters' dtype (grouped_mm is not autocast: fp32 under amp).
    `capacity` > 0 pads every expert to capacity x T x top_k / E rows (token-dropping routers:
    Megatron `moe_expert_capacity_factor`, GShard); 0 is dropless (transformers). Expert tensor
    parallelism (`etp`) splits each expert's intermediate width.
    Assumes: balanced experts when dropless.
    """
    h, k, E = m.hidden_size, m.num_experts_per_tok, m.num_experts
    rows = T * k
    S = np.where(np.asarray(capacity) > 0, rows * np.maximum(capacity, 1e-9), rows)
    fe = m.moe_intermediate_size / etp
    experts = e_expert * (2.0 * S * h + 4.0 * S * fe)
    router = 4.0 * T * E + 8.0 * T * k + 4.0 * T * k + 4.0 * T + 3 * 8.0 * S + 4.0 * S
    if m.router_fp32:
        # DeepseekV3TopkRouter: F.linear(x.float(), weight.float()) saves both fp32 copies.
        router = router + 4.0 * T * h + 4.0 * E * h
    out = experts + router + SMALL_TENSOR_BYTES
    if m.shared_expert_intermediate_size:
        out = out + 4.0 * e * T * m.shared_expert_intermediate_size
    if m.shared_expert_gate:
        out = out + e * T * h + e * T  # shared output and sigmoid(gate) saved by their product
    del amp
    return out
